"""Device memory of every worker process, gathered by the driver each step.

Each worker process answers :func:`process_memory_stats` (its device's peak allocated / reserved memory since the
last reset and its resident host memory, GiB) and resets its peak counters, so the next answer is the next step's
peak. :func:`memory_metrics` turns the per-rank answers into the step's metrics:

- ``perf/max_memory_allocated_gb``, ``perf/max_memory_reserved_gb``, ``perf/cpu_memory_used_gb``: the max over ranks
  (what a reader compares with one device's capacity);
- ``perf/rank<r>/max_memory_allocated_gb`` (and ``reserved``, ``cpu_memory_used``): every rank, for the JSONL;
- ``perf/num_memory_reports``: how many ranks answered.

In-process (one device) the worker is the driver's own process; under Ray each actor reports its own device, where
the driver's counters would read 0 (the driver holds no device).
"""

from __future__ import annotations

from npu_rl.device import get_backend

KEYS = ("max_memory_allocated_gb", "max_memory_reserved_gb", "cpu_memory_used_gb")


def process_memory_stats(reset: bool = True) -> dict[str, float]:
    backend = get_backend()
    backend.synchronize()
    stats = backend.memory_stats_gb()
    if reset:
        backend.reset_peak_memory_stats()
    return stats


def memory_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    if not per_rank:
        return {}
    out: dict[str, float] = {"perf/num_memory_reports": float(len(per_rank))}
    for key in KEYS:
        values = [float(stats.get(key, 0.0)) for stats in per_rank]
        out[f"perf/{key}"] = max(values)
        if len(per_rank) > 1:
            out |= {f"perf/rank{rank}/{key}": value for rank, value in enumerate(values)}
    return out
