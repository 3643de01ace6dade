"""``npu-rl bench moe``: forward + backward of one mixture-of-experts block of a real model's shape (random weights),
with each of transformers' experts implementations, routing and permutation included.

Implementations: ``eager`` (transformers' loop over the experts that received tokens), ``batched_mm`` (one batched
matmul over the gathered weights of every (token, expert) pair), ``grouped_mm`` (tokens sorted by expert, one
``torch._grouped_mm`` per projection: transformers' default where torch can dispatch it), ``grouped_mm_compiled``
(the same block under ``torch.compile``, which fuses the gating, weighting and permutation around the grouped
matmuls), ``experts_compiled`` (what ``use_torch_compile`` trains with: the experts compiled with symbolic token
counts around npu-rl's grouped-matmul custom ops, the router eager; npu_rl/models/compiled_experts.py).

Each is timed over ``--iters`` runs after ``--warmup`` (median), on the block's own module (the router ``gate`` and
the ``experts``; DeepSeek-V3's shared experts too), with the loss ``sum(out * g)`` for a fixed random ``g``, the
weights' gradients set to none before each run (one micro-batch after an optimizer step; they grew by accumulation
from run to run before). An out-of-memory error is reported as OOM, not raised.

``--profile N`` runs one more iteration of each row under ``torch.profiler`` and prints its N costliest device
kernels (CPU ops on a CPU) with the share of device time in matrix-multiply kernels, so a row that misses the peak
shows where its time goes.

FLOPs counted: ``3 x 2 x tokens x (top_k x 3 x hidden x moe_intermediate + hidden x num_experts + shared)`` (forward
and the two backward matmuls of every projection), against the device's dense bf16 peak (npu_rl/device/flops.py).

Run: ``npu-rl bench moe --shape qwen3-30b-a3b --tokens 16384`` (docs/benchmarks.md has the H200 figures).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from npu_rl.device import get_backend
from npu_rl.models.compiled_experts import compile_experts

# name -> (transformers model type, config fields of one MoE block)
SHAPES = {
    "qwen3-30b-a3b": ("qwen3_moe", dict(hidden_size=2048, moe_intermediate_size=768, num_experts=128,
                                        num_experts_per_tok=8, norm_topk_prob=True)),
    "qwen3-235b-a22b": ("qwen3_moe", dict(hidden_size=4096, moe_intermediate_size=1536, num_experts=128,
                                          num_experts_per_tok=8, norm_topk_prob=True)),
    "deepseek-v3": ("deepseek_v3", dict(hidden_size=7168, moe_intermediate_size=2048, n_routed_experts=256,
                                        num_experts_per_tok=8, n_shared_experts=1, n_group=8, topk_group=4,
                                        routed_scaling_factor=2.5, norm_topk_prob=True)),
    "tiny": ("qwen3_moe", dict(hidden_size=64, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                               norm_topk_prob=True)),
    "tiny-deepseek": ("deepseek_v3", dict(hidden_size=64, moe_intermediate_size=32, n_routed_experts=8,
                                          num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
                                          routed_scaling_factor=2.5, norm_topk_prob=True)),
}
IMPLEMENTATIONS = ("eager", "batched_mm", "grouped_mm", "grouped_mm_compiled", "experts_compiled")
COMPILED_INSIDE = ("grouped_mm_compiled", "experts_compiled")  # both run transformers' grouped_mm layout


def build_block(shape: str, implementation: str, dtype: torch.dtype,
                device: torch.device) -> tuple[torch.nn.Module, dict]:
    """One MoE block of ``shape`` from transformers' own classes, and the numbers the FLOP count needs."""
    from transformers import AutoConfig
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    model_type, fields = SHAPES[shape]
    config = AutoConfig.for_model(model_type, num_hidden_layers=1, **fields)
    config._experts_implementation = "grouped_mm" if implementation in COMPILED_INSIDE else implementation
    torch.manual_seed(0)
    with torch.device(device):
        block = (DeepseekV3MoE if model_type == "deepseek_v3" else Qwen3MoeSparseMoeBlock)(config)
    for param in block.parameters():
        torch.nn.init.normal_(param, std=0.02)
    block = block.to(dtype)
    num_experts = fields.get("num_experts", fields.get("n_routed_experts"))
    shared = 3 * fields["hidden_size"] * fields["moe_intermediate_size"] * fields.get("n_shared_experts", 0)
    per_token = (fields["num_experts_per_tok"] * 3 * fields["hidden_size"] * fields["moe_intermediate_size"]
                 + fields["hidden_size"] * num_experts + shared)
    return block, {"flops_per_token": 3 * 2 * per_token, "num_experts": num_experts}


def run_one(shape: str, implementation: str, num_tokens: int, args, backend) -> dict:
    row = {"shape": shape, "implementation": implementation, "tokens": num_tokens}
    device = backend.device()
    block = None
    try:
        block, numbers = build_block(shape, implementation, args.dtype, device)
        step = torch.compile(block) if implementation == "grouped_mm_compiled" else block
        if implementation == "experts_compiled" and not compile_experts(block):  # experts compiled, router eager
            raise RuntimeError("compile_experts found no experts module of transformers' experts interface")
        gen = torch.Generator(device="cpu").manual_seed(1)
        x = torch.randn(1, num_tokens, SHAPES[shape][1]["hidden_size"], generator=gen).to(device, args.dtype)
        g = torch.randn(x.shape, generator=gen).to(device, args.dtype)

        def once() -> None:  # one micro-batch: the weights' gradients start from none, as an optimizer step leaves them
            block.zero_grad(set_to_none=True)
            inputs = x.detach().requires_grad_()
            out = step(inputs)
            (out.float() * g.float()).sum().backward()

        for _ in range(args.warmup):
            once()
        backend.synchronize()
        backend.reset_peak_memory_stats()
        times = []
        for _ in range(args.iters):
            start = time.perf_counter()
            once()
            backend.synchronize()
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        flops = numbers["flops_per_token"] * num_tokens / seconds
        row.update(ms=round(seconds * 1e3, 2), tokens_per_s=round(num_tokens / seconds),
                   tflops=round(flops / 1e12, 1),
                   peak_share=round(flops / backend.peak_flops(args.dtype), 3),
                   peak_mem_gib=round(backend.memory_stats_gb()["max_memory_allocated_gb"], 2))
        if args.profile:
            row["profile"] = profile_once(once, backend, args.profile)
    except torch.OutOfMemoryError:
        row["error"] = "OOM"
    except RuntimeError as exc:  # said in the row, the other rows still run
        row["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
    finally:
        del block
        backend.empty_cache()
    return row


MATMUL_KERNELS = ("gemm", "cutlass", "nvjet", "grouped", "xmma", "matmul", "aten::mm", "aten::bmm", "aten::addmm",
                  "aten::_grouped_mm")


def profile_once(once, backend, top: int) -> dict:
    """One more ``once()`` under ``torch.profiler``: the ``top`` costliest kernels (on a CPU, the costliest ops by
    self time) as ``[name, calls, ms]``, the total and the matrix-multiply kernels' share (:data:`MATMUL_KERNELS`
    name parts)."""
    from torch.profiler import ProfilerActivity, profile

    on_device = backend.device().type != "cpu"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
    with profile(activities=activities) as prof:
        once()
        backend.synchronize()
    totals: dict[str, list] = {}
    for event in prof.key_averages():
        if on_device:  # device kernels only: their self device time, no op counted twice
            us = event.self_device_time_total if event.device_type != torch.autograd.DeviceType.CPU else 0
        else:
            us = event.self_cpu_time_total
        if us > 0:
            entry = totals.setdefault(event.key, [0, 0.0])
            entry[0] += event.count
            entry[1] += us / 1e3
    total_ms = sum(ms for _, ms in totals.values())
    matmul_ms = sum(ms for name, (_, ms) in totals.items() if any(k in name.lower() for k in MATMUL_KERNELS))
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])[:top]
    return {"counted": "device kernels" if on_device else "CPU ops (self time)", "total_ms": round(total_ms, 3),
            "matmul_ms": round(matmul_ms, 3), "matmul_share": round(matmul_ms / total_ms, 3) if total_ms else 0.0,
            "top": [[name[:120], calls, round(ms, 3)] for name, (calls, ms) in ranked]}


def format_profile(row: dict) -> str:
    p = row["profile"]
    lines = [f"profile of {row['shape']} {row['implementation']} {row['tokens']} tokens: {p['total_ms']} ms in "
             f"{p['counted']}, {p['matmul_ms']} ms ({p['matmul_share']:.0%}) in matrix multiplies",
             "| kernel | calls | ms |", "|---|---|---|"]
    lines += [f"| {name} | {calls} | {ms} |" for name, calls, ms in p["top"]]
    return "\n".join(lines)


def format_table(rows: list[dict]) -> str:
    lines = ["| shape | implementation | tokens | ms (fwd+bwd) | tokens/s | TFLOP/s | share of bf16 peak | peak GiB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['shape']} | {r['implementation']} | {r['tokens']} | {r['error']} | | | | |")
        else:
            lines.append(f"| {r['shape']} | {r['implementation']} | {r['tokens']} | {r['ms']} | {r['tokens_per_s']} | "
                         f"{r['tflops']} | {r['peak_share']:.0%} | {r['peak_mem_gib']} |")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="npu-rl bench moe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen3-30b-a3b", help=f"comma list of {', '.join(SHAPES)}")
    parser.add_argument("--implementations", default=",".join(IMPLEMENTATIONS),
                        help=f"comma list of {', '.join(IMPLEMENTATIONS)}")
    parser.add_argument("--tokens", default="16384", help="comma list of token counts per step")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile one more iteration of each row and print its N costliest kernels")
    parser.add_argument("--json", default=None, help="append the rows as JSON lines to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    for name, known in ((args.shape, SHAPES), (args.implementations, IMPLEMENTATIONS)):
        unknown = [n for n in name.split(",") if n not in known]
        if unknown:
            print(f"npu-rl bench moe: unknown {', '.join(unknown)}; known: {', '.join(known)}")
            return 2
    if args.iters < 1 or args.warmup < 0 or args.profile < 0:
        print("npu-rl bench moe: --iters must be >= 1, --warmup and --profile >= 0")
        return 2
    backend = get_backend()
    print(f"device: {backend.name} {backend.device_name()}  torch {torch.__version__}", flush=True)
    rows = []
    for shape in args.shape.split(","):
        for num_tokens in (int(t) for t in args.tokens.split(",")):
            for implementation in args.implementations.split(","):
                rows.append(run_one(shape, implementation, num_tokens, args, backend))
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "profile"}), flush=True)
                if args.json:  # row by row: a run cut short keeps what it measured
                    with open(args.json, "a") as out:
                        out.write(json.dumps(rows[-1]) + "\n")
    print(format_table(rows))
    for row in rows:
        if "profile" in row:
            print(format_profile(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
