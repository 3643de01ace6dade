"""Profile one policy update of an in-process run (``npu-rl bench trainer --profile DIR``).

:class:`UpdateProfiler` wraps ``ActorRolloutWorker.update_policy`` for the block and runs its ``call``-th call
under ``torch.profiler`` (CPU + the accelerator), then writes ``DIR/profile_<label>.txt``: the wall time, the
device time summed by category (matmul, attention, elementwise / norm, communication, optimizer, copies) and
the idle share, then the top operators by device time. Categories come from kernel names, so they are a guide,
not an exact split.
"""

from __future__ import annotations

import os
import re
import time

from npu_rl.device import get_backend
from npu_rl.workers.actor_rollout import ActorRolloutWorker

CATEGORIES = [  # first match wins
    ("communication", re.compile(r"nccl|hccl|all_gather|reduce_scatter|allreduce", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa|flex", re.I)),
    ("matmul", re.compile(r"gemm|nvjet|cutlass|matmul|sm90_xmma|wgmma|\bmm\b|addmm|bmm", re.I)),
    ("optimizer", re.compile(r"adam|foreach|multi_tensor", re.I)),
    ("log-prob kernels (triton)", re.compile(r"triton|_kernel_", re.I)),
    ("copies / casts", re.compile(r"copy|memcpy|memset|cast|to_copy|convert", re.I)),
]


def categorize(name: str) -> str:
    for category, pattern in CATEGORIES:
        if pattern.search(name):
            return category
    return "elementwise / norm / other"


class UpdateProfiler:
    def __init__(self, folder: str, label: str, call: int = 2, row_limit: int = 40):
        self.folder, self.label, self.call, self.row_limit = folder, label, call, row_limit
        self._original = None

    def __enter__(self):
        original = self._original = ActorRolloutWorker.update_policy
        profiler, state = self, {"calls": 0}

        def update_policy(worker, batch):
            state["calls"] += 1
            if state["calls"] != profiler.call:
                return original(worker, batch)
            return profiler._profiled(original, worker, batch)

        update_policy.__dict__.update(original.__dict__)  # keep the dispatch registration
        ActorRolloutWorker.update_policy = update_policy
        return self

    def __exit__(self, *exc):
        ActorRolloutWorker.update_policy = self._original
        return False

    def _profiled(self, original, worker, batch):
        import torch
        from torch.profiler import ProfilerActivity, profile


        backend = get_backend()
        activities = [getattr(ProfilerActivity, name) for name in backend.profiler_activities]
        backend.synchronize()
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            out = original(worker, batch)
            backend.synchronize()
            wall = time.perf_counter() - start
        self.write(prof, wall, torch.__version__)
        return out

    def write(self, prof, wall_s: float, torch_version: str) -> str:
        os.makedirs(self.folder, exist_ok=True)
        averages = prof.key_averages()
        device_events = [e for e in averages if getattr(e, "self_device_time_total", 0) > 0]
        busy_us = sum(e.self_device_time_total for e in device_events)
        by_category: dict[str, float] = {}
        for event in device_events:
            by_category[categorize(event.key)] = by_category.get(categorize(event.key), 0.0) + \
                event.self_device_time_total
        lines = [f"update of run {self.label!r}, call {self.call}; torch {torch_version}",
                 f"wall {wall_s * 1e3:.1f} ms; device kernels {busy_us / 1e3:.1f} ms "
                 f"({100 * busy_us / 1e6 / wall_s:.0f}% of wall; the rest is the device idle: launch gaps, host work)",
                 "", "| category | device ms | share of kernel time |", "|---|---|---|"]
        for category, us in sorted(by_category.items(), key=lambda kv: -kv[1]):
            lines.append(f"| {category} | {us / 1e3:.1f} | {100 * us / max(busy_us, 1):.1f}% |")
        lines += ["", "top kernels by device time:"]
        for event in sorted(device_events, key=lambda e: -e.self_device_time_total)[: self.row_limit]:
            lines.append(f"{event.self_device_time_total / 1e3:9.2f} ms  x{event.count:<6d} {event.key[:140]}")
        lines += ["", "operators (CPU view, sorted by device time):",
                  averages.table(sort_by="device_time_total" if device_events else "cpu_time_total",
                                 row_limit=self.row_limit, max_name_column_width=80)]
        path = os.path.join(self.folder, f"profile_{re.sub(r'[^A-Za-z0-9_.-]+', '_', self.label)}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        return path
