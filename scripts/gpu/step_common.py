"""What the GPU step scripts (moe_grpo_step.py, vl_grpo_step.py) share: their scratch folder, emptied only when they
made it, and each step's figures printed to the log, which comes back from the device in the call's output even
when the files under $OUT do not (2026-12-07: an H100 call returned the logs and left the metrics files out)."""

from __future__ import annotations

import json
import os
import shutil

KEYS = ("timing_s/step", "timing_s/gen", "timing_s/update_weights", "timing_s/old_log_prob", "timing_s/ref",
        "timing_s/update_actor", "perf/throughput", "perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb",
        "actor/moe/routing_mismatch", "training/rollout_probs_diff_max", "prompt_length/mean")
WORK_MARKER = ".npu_rl_gpu_step_work"  # written into every scratch folder a step script makes


def fresh_work_folder(path: str) -> None:
    """An empty ``path`` for the run: a folder these scripts made before (it holds :data:`WORK_MARKER`) is removed
    and made again; any other folder that holds anything is refused, never removed (``--work`` may name a folder of
    the user's)."""
    if os.path.lexists(path):
        if os.path.isdir(path) and not os.path.islink(path) and os.path.isfile(os.path.join(path, WORK_MARKER)):
            shutil.rmtree(path)
        elif not os.path.isdir(path) or os.path.islink(path) or os.listdir(path):
            raise SystemExit(f"--work {path}: exists and was not made by this script (no {WORK_MARKER} in it); "
                             "give a new or empty folder")
    os.makedirs(path, exist_ok=True)
    open(os.path.join(path, WORK_MARKER), "w").close()


def print_step_figures(path: str) -> None:
    """One line a step of a run's metrics.jsonl: its times, memory, throughput and MoE / rollout gaps."""
    with open(path) as f:
        for number, line in enumerate(f, 1):
            row = json.loads(line)
            figures = "  ".join(f"{key}={row[key]:.4g}" for key in KEYS if isinstance(row.get(key), (int, float)))
            print(f"== step {row.get('step', number)}: {figures}", flush=True)
