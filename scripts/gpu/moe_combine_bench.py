"""The MoE top-k combine alone, at a layer's real width: the Triton kernel (npu_rl.kernels.moe_combine) at several
tile sizes against the same gather, product and sum compiled by inductor (what the compiled experts ran before) and
against a plain copy of the rows (the memory-bandwidth bound: the combine reads the rows once and writes a k-th of
them). Checks each against the plain expression first; prints ms and GB/s a row and writes them to --json.

    python3 scripts/gpu/moe_combine_bench.py --tokens 65536 --hidden 2048 --top-k 8 --json $OUT/combine.json
"""

from __future__ import annotations

import argparse
import json

import torch

from npu_rl.kernels.moe_combine import topk_combine_torch, topk_combine_triton


def timed(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    tokens, k, hidden = args.tokens, args.top_k, args.hidden
    g = torch.Generator(device="cuda").manual_seed(0)
    expert_ids = torch.randint(0, args.experts, (tokens * k,), device="cuda", generator=g)
    _, perm = torch.sort(expert_ids)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device="cuda")
    y = torch.randn(tokens * k, hidden, device="cuda", dtype=torch.bfloat16, generator=g)
    weight = torch.rand(tokens * k, device="cuda", generator=g).to(torch.bfloat16)
    moved = (y.numel() + tokens * hidden) * y.element_size()  # read every row once, write the tokens
    expected = topk_combine_torch(y, inverse, weight, k)

    inductor = torch.compile(lambda: (y * weight.unsqueeze(-1)[perm])[inverse].view(-1, k, hidden).sum(1),
                             dynamic=True)
    rows = []

    def add(name, fn, check=True):
        out = fn()
        err = float((out.float() - expected.float()).abs().max()) if check else None
        ms = timed(fn, args.iters)
        rows.append({"name": name, "ms": round(ms, 3), "GB/s": round(moved / ms / 1e6, 1), "max_abs_err": err})
        print(json.dumps(rows[-1]), flush=True)

    add("copy of the rows (bandwidth bound)", lambda: y.clone(), check=False)
    add("inductor: (y * w)[inverse].view(T, k, H).sum(1)", inductor)
    add("torch eager (fp32)", lambda: topk_combine_torch(y, inverse, weight, k))
    for block in (256, 512, 1024, 2048):
        for warps in (2, 4, 8):
            if block <= hidden * 2:
                add(f"triton block {block} warps {warps}",
                    lambda b=block, w=warps: topk_combine_triton(y, inverse, weight, k, block=b, num_warps=w))
    add("triton default", lambda: topk_combine_triton(y, inverse, weight, k))
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}; {tokens} tokens x top-{k}, "
          f"hidden {hidden}, bf16; {moved / 1e9:.2f} GB moved a call")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"tokens": tokens, "hidden": hidden, "top_k": k, "rows": rows}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
