"""``npu-rl bench kernels``: time and peak memory of log-prob + entropy from hidden states, naive vs fused.

For each model shape and token count (bf16, random weights with a trained model's logit spread), each method runs
forward alone (no grad: the old-log-prob / reference pass) and forward + backward of
``sum(g1 * logprobs + g2 * entropy)`` (the actor update), and reports the median wall time over ``--iters`` runs
after ``--warmup`` runs, and the peak device memory the step allocated above its inputs.

Methods: ``naive`` (full logits, float32 log_softmax, gather, entropy: what a plain model forward does), ``torch``
(the chunked torch implementation), ``triton`` (fully fused kernels), ``triton_mm`` (library matmul + Triton
epilogue kernels; what ``backend="auto"`` runs on an accelerator), ``triton_mm_lp`` (the same with a loss on the
log-probs only), ``liger`` (Liger-Kernel's fused linear cross-entropy with ``reduction="none"``: per-token
log-probs, a per-token upstream gradient, no entropy; compare it with ``triton_mm_lp``) and ``liger_sum`` (Liger
with ``reduction="sum"``: a scalar loss whose gradient Liger computes during the forward; a PPO loss cannot use
it). An out-of-memory error is reported as OOM, not raised. ``--sweep`` also times the fully fused kernels over
several tiles (tile tuning); ``--chunk-mib`` sets the triton backends' gradient-chunk budget.

Run: ``python -m npu_rl.commands.bench_kernels`` (defaults: Qwen2.5-0.5B and -7B lm_head shapes, 16k and 64k tokens).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from npu_rl.device import get_backend
from npu_rl.kernels import _device, linear_ops
from npu_rl.kernels.plain import naive_logprob_entropy
from npu_rl.kernels.tiles import TileConfig
import npu_rl.kernels as K

SHAPES = {"0.5b": (896, 151_936), "7b": (3584, 152_064), "tiny": (64, 1_000)}
METHODS = ("naive", "torch", "triton", "triton_mm", "triton_mm_lp", "liger", "liger_sum")
SWEEP_TILES = ((128, 128, 64, 4, 8), (128, 128, 64, 3, 8), (128, 256, 64, 3, 8), (64, 128, 64, 4, 4),
               (128, 64, 64, 4, 4), (64, 256, 64, 3, 8))
GIB = 1024**3


def _methods(name: str, tiles=None):
    """(forward fn(h, w, t) -> (logprobs, entropy | None), whether the loss uses the entropy)."""
    if name == "naive":
        return naive_logprob_entropy, True
    if name.startswith("liger"):
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        reduction = "sum" if name == "liger_sum" else "none"
        return (lambda h, w, t: (-liger_fused_linear_cross_entropy(h, w, t, reduction=reduction), None)), False
    backend = name.removesuffix("_lp")
    return (lambda h, w, t: K.linear_logprob_entropy(h, w, t, backend=backend, tiles=tiles)), not name.endswith("_lp")


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _measure(fn, uses_entropy, inputs, iters, warmup, backend) -> dict:
    hidden, weight, targets, g1, g2 = inputs

    def forward_only():
        with torch.no_grad():
            fn(hidden, weight, targets)

    def step():
        hidden.grad = weight.grad = None
        logprobs, entropy = fn(hidden, weight, targets)
        loss = (logprobs * g1).sum() if logprobs.dim() else logprobs
        if uses_entropy:
            loss = loss + (entropy * g2).sum()
        loss.backward()

    result = {}
    for key, run in (("fwd", forward_only), ("fwd_bwd", step)):
        hidden.grad = weight.grad = None
        backend.synchronize()
        backend.reset_peak_memory_stats()
        base = backend.memory_stats_gb()["max_memory_allocated_gb"]  # = allocated now, right after the reset
        run()
        backend.synchronize()
        result[f"{key}_peak_gib"] = backend.memory_stats_gb()["max_memory_allocated_gb"] - base
        for _ in range(warmup):
            run()
        times = []
        for _ in range(iters):
            backend.synchronize()
            start = time.perf_counter()
            run()
            backend.synchronize()
            times.append(time.perf_counter() - start)
        result[f"{key}_ms"] = 1e3 * statistics.median(times)
    hidden.grad = weight.grad = None
    return result


def _inputs(shape, num_tokens, dtype, device, seed=0):
    hidden_size, vocab = SHAPES[shape]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    hidden = torch.randn(num_tokens, hidden_size, generator=gen).to(device, dtype).requires_grad_()
    weight = (torch.randn(vocab, hidden_size, generator=gen) * (2.0 / hidden_size**0.5)).to(device, dtype)
    targets = torch.randint(0, vocab, (num_tokens,), generator=gen).to(device)
    g1, g2 = (torch.randn(num_tokens, generator=gen).to(device) for _ in range(2))
    return hidden, weight.requires_grad_(), targets, g1, g2


def run_one(shape, num_tokens, method, args, backend, tiles=None) -> dict:
    row = {"shape": shape, "tokens": num_tokens, "method": method}
    try:
        fn, uses_entropy = _methods(method, tiles)
    except ImportError as exc:
        return {**row, "error": f"not installed ({exc.name})"}
    inputs = None
    try:
        inputs = _inputs(shape, num_tokens, args.dtype, backend.device())
        row.update(_measure(fn, uses_entropy, inputs, args.iters, args.warmup, backend))
    except Exception as exc:  # one failing method must not stop the table
        if not _is_oom(exc):
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        else:
            row["error"] = "OOM"
    finally:
        del inputs
        backend.empty_cache()
    return row


def _fmt(row, key, ref=None):
    if "error" in row:
        return row["error"] if key.endswith("_ms") else ""
    value = row[key]
    if key.endswith("_ms"):
        text = f"{value:.1f}"
        if ref and "error" not in ref:
            text += f" ({ref[key] / value:.2f}x)"
    else:
        text = f"{value:.2f}"
        if ref and "error" not in ref and value > 0:
            text += f" (1/{ref[key] / value:.0f})"
    return text


def format_table(rows) -> str:
    lines = ["| shape | tokens | method | fwd ms | fwd+bwd ms (speed-up vs naive) | fwd+bwd peak GiB (vs naive) |"
             " fwd peak GiB |", "|---|---|---|---|---|---|---|"]
    naive = {(r["shape"], r["tokens"]): r for r in rows if r["method"] == "naive"}
    for r in rows:
        ref = naive.get((r["shape"], r["tokens"]))
        ref = None if r is ref else ref
        lines.append(f"| {r['shape']} | {r['tokens']} | {r['method']} | {_fmt(r, 'fwd_ms')} | "
                     f"{_fmt(r, 'fwd_bwd_ms', ref)} | {_fmt(r, 'fwd_bwd_peak_gib', ref)} | "
                     f"{_fmt(r, 'fwd_peak_gib')} |")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="npu-rl bench kernels", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="0.5b,7b", help=f"comma list of {', '.join(SHAPES)}")
    parser.add_argument("--tokens", default="16384,65536", help="comma list of token counts")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma list of {', '.join(METHODS)}")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--sweep", action="store_true", help="also time the fused kernels over SWEEP_TILES")
    parser.add_argument("--chunk-mib", type=int, help="gradient-chunk budget of the triton backends (default 1024)")
    parser.add_argument("--json", help="append one JSON object per measurement to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32


    backend = get_backend()
    if args.chunk_mib:
        linear_ops.DEFAULT_CHUNK_BYTES = args.chunk_mib << 20
    print(f"device: {_device.device_kind()}  torch {torch.__version__}", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        for num_tokens in (int(t) for t in args.tokens.split(",")):
            for method in args.methods.split(","):
                if method not in METHODS:
                    print(f"unknown method {method!r}; known: {', '.join(METHODS)}", file=sys.stderr)
                    return 2
                rows.append(run_one(shape, num_tokens, method, args, backend))
                print(json.dumps(rows[-1]), flush=True)
    if args.sweep:
        shape, num_tokens = args.shapes.split(",")[0], int(args.tokens.split(",")[0])
        for tile in SWEEP_TILES:
            row = run_one(shape, num_tokens, "triton", args, backend, tiles=TileConfig(*tile))
            rows.append({**row, "method": f"triton tile {tile}"})
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "a") as out:
            for row in rows:
                out.write(json.dumps(row) + "\n")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
