"""Per-rank memory reports: the max over ranks, every rank in the JSONL, and the worker method."""

from __future__ import annotations

from npu_rl.controller import LocalWorkerGroup, WorkerSpec
from npu_rl.device.memory_report import memory_metrics
from npu_rl.workers.memory import ReportsMemory


def test_max_over_ranks_and_per_rank():
    reports = [{"max_memory_allocated_gb": 3.0, "max_memory_reserved_gb": 4.0, "cpu_memory_used_gb": 1.5},
               {"max_memory_allocated_gb": 5.0, "max_memory_reserved_gb": 3.5, "cpu_memory_used_gb": 1.0}]
    out = memory_metrics(reports)
    assert out["perf/max_memory_allocated_gb"] == 5.0 and out["perf/max_memory_reserved_gb"] == 4.0
    assert out["perf/cpu_memory_used_gb"] == 1.5 and out["perf/num_memory_reports"] == 2.0
    assert out["perf/rank0/max_memory_allocated_gb"] == 3.0 and out["perf/rank1/max_memory_reserved_gb"] == 3.5
    assert len(out) == 1 + 3 + 6


def test_one_rank_has_no_per_rank_copies_and_nothing_is_empty():
    out = memory_metrics([{"max_memory_allocated_gb": 2.0, "max_memory_reserved_gb": 2.5, "cpu_memory_used_gb": 1.0}])
    assert out == {"perf/num_memory_reports": 1.0, "perf/max_memory_allocated_gb": 2.0,
                   "perf/max_memory_reserved_gb": 2.5, "perf/cpu_memory_used_gb": 1.0}
    assert memory_metrics([]) == {}


class _Worker(ReportsMemory):
    pass


def test_worker_method_is_registered_for_every_rank():
    group = LocalWorkerGroup({"w": WorkerSpec(_Worker)})
    (stats,) = group.w.memory_stats()
    assert stats["cpu_memory_used_gb"] > 0 and set(stats) >= {"max_memory_allocated_gb", "max_memory_reserved_gb"}
