"""Packed attention kernels on an accelerator: error against the fp32 per-segment reference and fwd+bwd time.

    python scripts/varlen_check.py [--tokens 24576] [--heads 14] [--kv-heads 2] [--dim 64] [--max-len 384]

Segments of random lengths (max_len/2 .. max_len) fill ``--tokens``; q, k, v are random bf16. For every kernel
name of :mod:`npu_rl.parallel.varlen_kernels` usable here: forward output and the q/k/v gradients of
``sum(out * g)`` (random ``g``) against the fp32 ``sdpa`` reference (relative L2 error), and the median fwd+bwd
time over 10 runs after 3 warm-ups (device events). Also the padded SDPA ``[B, H, max_len, D]`` with a causal
mask for the same tokens as a yardstick (what the padded update runs).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from npu_rl.device import get_backend
from npu_rl.parallel.varlen_kernels import kernel_by_name, sdpa_varlen


def _time(fn, backend, repeats=10, warmup=3) -> float:
    for _ in range(warmup):
        fn()
    backend.synchronize()
    times = []
    if not backend.is_accelerator:
        import time

        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return sorted(times)[len(times) // 2]
    for _ in range(repeats):
        start, end = backend.module.Event(enable_timing=True), backend.module.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        backend.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=24576)
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--max-len", type=int, default=384)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    backend = get_backend()
    device = backend.device()
    gen = torch.Generator().manual_seed(0)
    lengths = []
    while sum(lengths) < args.tokens:
        lengths.append(int(torch.randint(args.max_len // 2, args.max_len + 1, (1,), generator=gen)))
    lengths[-1] -= sum(lengths) - args.tokens
    total = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    layout = dict(cu_seqlens=cu, seqlens=lengths, max_seqlen=max(lengths), scale=args.dim ** -0.5)
    q = torch.randn(total, args.heads, args.dim, device=device, dtype=torch.bfloat16)
    k = torch.randn(total, args.kv_heads, args.dim, device=device, dtype=torch.bfloat16)
    v = torch.randn(total, args.kv_heads, args.dim, device=device, dtype=torch.bfloat16)
    g = torch.randn(total, args.heads, args.dim, device=device, dtype=torch.bfloat16)

    def run(kernel, dtype):
        leaves = [t.detach().to(dtype, copy=True).requires_grad_() for t in (q, k, v)]  # fresh leaves
        out = kernel(*leaves, **layout)
        (out.float() * g.float()).sum().backward()
        return [out.detach().float()] + [t.grad.float() for t in leaves]

    reference = run(sdpa_varlen, torch.float32)
    rows = []
    for name in ("sdpa", "torch_varlen", "flex", "flash_attn"):
        kernel = kernel_by_name(name, accelerator=backend.is_accelerator)
        if kernel is None:
            rows.append({"kernel": name, "available": False})
            continue
        try:
            got = run(kernel, torch.bfloat16)
            errors = [float((a - b).norm() / b.norm()) for a, b in zip(got, reference)]
            ms = _time(lambda: run(kernel, torch.bfloat16), backend)
            rows.append({"kernel": name, "available": True, "rel_err_out_dq_dk_dv": errors, "fwd_bwd_ms": ms})
        except Exception as exc:  # report and go on: this is a survey
            rows.append({"kernel": name, "available": True, "error": f"{type(exc).__name__}: {exc}"[:300]})

    # Padded yardstick: the same number of rows, each padded to max_len, causal + key padding mask.
    rows_n = len(lengths)
    mask = torch.arange(args.max_len, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]
    allowed = torch.ones(args.max_len, args.max_len, dtype=torch.bool, device=device).tril()[None] & mask[:, None, :]
    shape = (rows_n, args.heads, args.max_len, args.dim)
    pq = torch.randn(shape, device=device, dtype=torch.bfloat16)
    pk = torch.randn(rows_n, args.kv_heads, args.max_len, args.dim, device=device, dtype=torch.bfloat16)
    pv = torch.randn_like(pk)

    def padded():
        leaves = [t.clone().requires_grad_() for t in (pq, pk, pv)]
        out = F.scaled_dot_product_attention(*leaves, attn_mask=allowed[:, None], enable_gqa=True)
        out.sum().backward()

    rows.append({"kernel": "padded sdpa (mask)", "available": True, "fwd_bwd_ms": _time(padded, backend)})
    print(f"{total} tokens in {len(lengths)} segments, heads {args.heads}/{args.kv_heads}, dim {args.dim}, bf16, "
          f"{backend.device_name()}")
    print("| kernel | fwd+bwd ms | rel. error out / dq / dk / dv vs fp32 reference |")
    print("|---|---|---|")
    for row in rows:
        if not row["available"]:
            print(f"| {row['kernel']} | not available | |")
        elif "error" in row:
            print(f"| {row['kernel']} | failed: {row['error']} | |")
        else:
            errs = " / ".join(f"{e:.1e}" for e in row.get("rel_err_out_dq_dk_dv", []))
            print(f"| {row['kernel']} | {row['fwd_bwd_ms']:.2f} | {errs} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
