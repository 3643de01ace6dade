"""The figures of each step of a run's metrics.jsonl, one printed line a step, for the GPU step scripts: the log
comes back from the device in the call's output even when the files under $OUT do not (2026-12-07: an H100 call
returned the logs and left the metrics files out)."""

from __future__ import annotations

import json

KEYS = ("timing_s/step", "timing_s/gen", "timing_s/update_weights", "timing_s/old_log_prob", "timing_s/ref",
        "timing_s/update_actor", "perf/throughput", "perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb",
        "actor/moe/routing_mismatch", "training/rollout_probs_diff_max", "prompt_length/mean")


def print_step_figures(path: str) -> None:
    with open(path) as f:
        for number, line in enumerate(f, 1):
            row = json.loads(line)
            figures = "  ".join(f"{key}={row[key]:.4g}" for key in KEYS if isinstance(row.get(key), (int, float)))
            print(f"== step {row.get('step', number)}: {figures}", flush=True)
