"""How close one decode step's memory traffic gets to the HBM bandwidth on this GPU: the planner's
``DECODE_BANDWIDTH_EFFICIENCY`` (npu_rl/plan/timing.py), measured without an engine's overheads.

A Qwen2.5-7B-shaped stack of bf16 weights (28 layers: q/k/v, o, gate/up, down) is multiplied by ``rows`` token
vectors, and ``rows`` queries attend over a bf16 KV cache of ``context`` tokens per row (SDPA, one query token),
each captured in a CUDA graph and replayed, so launches cost nothing. Prints bytes read, time and the achieved share of
the datasheet bandwidth, as JSON lines; torch only (no vLLM, no model code).

    python3 scripts/gpu/decode_roofline.py --bandwidth-tb-s 4.8 > $OUT/decode_roofline.jsonl
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
import torch.nn.functional as F

HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, DIM = 3584, 18944, 28, 28, 4, 128  # Qwen2.5-7B


def timed(fn, repeats: int = 20) -> float:
    """Seconds per call of ``fn`` replayed from a CUDA graph (median of ``repeats``)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bandwidth-tb-s", type=float, default=4.8)
    parser.add_argument("--rows", default="1,8,32,64,128,256,512")
    parser.add_argument("--contexts", default="512,2048,4096")
    args = parser.parse_args()
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    q_out = (HEADS + 2 * KV_HEADS) * DIM
    layers = [(torch.randn(HIDDEN, q_out, device=dev, dtype=dt), torch.randn(HEADS * DIM, HIDDEN, device=dev, dtype=dt),
               torch.randn(HIDDEN, 2 * INTERMEDIATE, device=dev, dtype=dt),
               torch.randn(INTERMEDIATE, HIDDEN, device=dev, dtype=dt)) for _ in range(LAYERS)]
    weight_bytes = sum(w.numel() * w.element_size() for layer in layers for w in layer)
    peak = args.bandwidth_tb_s * 1e12
    for rows in [int(r) for r in args.rows.split(",")]:
        x = torch.randn(rows, HIDDEN, device=dev, dtype=dt)

        def weights_pass(x=x):
            for qkv, o, gate_up, down in layers:
                qkv_out = x @ qkv
                h = qkv_out[:, :HEADS * DIM] @ o
                g = h @ gate_up
                _ = g[:, :INTERMEDIATE] @ down

        seconds = timed(weights_pass)
        flops = 2 * rows * weight_bytes / 2
        print(json.dumps({"kind": "weights", "rows": rows, "bytes": weight_bytes, "s": seconds,
                          "bandwidth_share": weight_bytes / seconds / peak, "tflops": flops / seconds / 1e12}),
              flush=True)
        for context in [int(c) for c in args.contexts.split(",")]:
            kv_bytes = 2 * rows * KV_HEADS * context * DIM * 2
            if kv_bytes > 40e9:
                continue
            q = torch.randn(rows, HEADS, 1, DIM, device=dev, dtype=dt)
            k = torch.randn(rows, KV_HEADS, context, DIM, device=dev, dtype=dt)
            v = torch.randn(rows, KV_HEADS, context, DIM, device=dev, dtype=dt)
            seconds = timed(functools.partial(F.scaled_dot_product_attention, q, k, v, enable_gqa=True))
            print(json.dumps({"kind": "kv one layer", "rows": rows, "context": context, "bytes": kv_bytes,
                              "s": seconds, "bandwidth_share": kv_bytes / seconds / peak}), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
