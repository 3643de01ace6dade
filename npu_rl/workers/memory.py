"""A worker method that reports this process's device memory (see :mod:`npu_rl.device.memory_report`)."""

from __future__ import annotations

from npu_rl.controller.dispatch import Dispatch, register
from npu_rl.device.memory_report import process_memory_stats


class ReportsMemory:
    """Mix into a worker class: ``group.<role>.memory_stats()`` returns one dict per rank."""

    @register(Dispatch.ALL)
    def memory_stats(self, reset: bool = True) -> dict[str, float]:
        return process_memory_stats(reset)
