"""Does torch's allocated counter keep a sleeping vLLM's weights and KV cache? (docs/moe.md, "Memory of an MoE
step": the plan assumes it does, from vllm/device_allocator/cumem.py.) Starts vLLM in-process on the 4-layer
Qwen3-30B-A3B shape of moe_grpo_step.py (random weights; KEEP_MOE=1 carry_vllm.sh for the MoE kernels) and prints
``torch.cuda.memory_allocated()`` and the device's used memory (``mem_get_info``) awake, after ``sleep(level=1)`` and
after ``wake_up()``. Expected if the plan is right: allocated unchanged by sleep, used memory down by about the
weights plus the KV cache.

    python3 scripts/gpu/vllm_sleep_counter.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_grpo_step import QWEN3_30B_A3B, save_model  # noqa: E402  (a sibling script)

GIB = 2**30


def reading(label: str) -> dict:
    free, total = torch.cuda.mem_get_info()
    row = {"when": label, "allocated_gib": torch.cuda.memory_allocated() / GIB,
           "reserved_gib": torch.cuda.memory_reserved() / GIB, "device_used_gib": (total - free) / GIB}
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/out")
    parser.add_argument("--work", default="/tmp/vllm_sleep_counter")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

    folder = save_model(os.path.join(args.work, "model"), 4, QWEN3_30B_A3B)
    llm = LLM(model=folder, skip_tokenizer_init=True, dtype="bfloat16", enable_sleep_mode=True,
              gpu_memory_utilization=args.gpu_memory_utilization, distributed_executor_backend="uni",
              max_model_len=512, enforce_eager=True)
    rows = [reading("awake")]
    llm.sleep(level=1)
    rows.append(reading("asleep (level 1)"))
    llm.wake_up()
    rows.append(reading("awake again"))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "vllm_sleep_counter.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
