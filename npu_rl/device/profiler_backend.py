"""The device-specific half of profiling (``npu_rl/trainer/profiling.py`` is the rest): which profiler module and
activities a device has, and the range markers of nsys.

- CPU: ``torch.profiler`` with the CPU activity; CUDA: plus the CUDA activity; NPU: ``torch_npu.profiler`` (its
  ``profile`` is keyword-only; activities CPU + NPU; traces through its ``tensorboard_trace_handler``, which writes a
  ``<worker_name>_<timestamp>_ascend_pt`` folder that MindStudio Insight and ``torch_npu.profiler.analyse`` read:
  :func:`trace_path` finds it). verl's NPU options: ``level`` (``level0`` | ``level1`` | ``level2`` |
  ``level_none`` -> ``_ExperimentalConfig(profiler_level=ProfilerLevel.Level0 ...)``), ``analysis`` (the handler's
  ``analyse_flag``: parse the raw data into the timeline at the end of the phase, or leave it for an offline
  ``torch_npu.profiler.profiler.analyse``), and ``mstx`` in ``contents`` (``_ExperimentalConfig(mstx=True)`` and a
  ``torch_npu.npu.mstx`` range named after the phase, for msprof / MindStudio). Names checked against torch_npu
  2.7.1 / 2.10.0.post4 / 2.14.0 (tests/device/test_real_packages.py); never run on an NPU here.
- nsys: NVTX ranges (``torch.cuda.nvtx``) around each phase and ``torch.cuda.profiler.start/stop`` around each
  profiled step, so ``nsys profile --capture-range=cudaProfilerApi`` records exactly those steps. CUDA only.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

# what each device offers
TOOLS_BY_DEVICE = {
    "cpu": ("torch", "precision_debugger"),
    "cuda": ("torch", "nsys", "torch_memory", "precision_debugger"),
    "npu": ("torch", "npu", "torch_memory", "precision_debugger"),
}


ALL_TOOLS = ("torch", "npu", "nsys", "torch_memory", "precision_debugger")
TRACE_TOOLS = ("torch", "npu")  # a trace per phase; both use torch_npu.profiler on Ascend


def check_tool(tool: str, device: str) -> None:
    if tool not in TOOLS_BY_DEVICE.get(device, ()):
        raise ValueError(f"global_profiler.tool={tool!r} is not available on {device}: this device offers "
                         f"{', '.join(TOOLS_BY_DEVICE.get(device, ()))}")


NPU_LEVELS = {"level0": "Level0", "level1": "Level1", "level2": "Level2", "level_none": "Level_none"}


def npu_level(level: str) -> str:
    """verl's ``tool_config.npu.level`` -> the ``torch_npu.profiler.ProfilerLevel`` attribute."""
    key = str(level).strip().lower()
    if key not in NPU_LEVELS:
        raise ValueError(f"profiler tool_config.npu.level={level!r}: expected one of {', '.join(NPU_LEVELS)}")
    return NPU_LEVELS[key]


@contextlib.contextmanager
def _mstx_range(torch_npu, name: str):
    range_id = torch_npu.npu.mstx.range_start(name)
    try:
        yield
    finally:
        torch_npu.npu.mstx.range_end(range_id)


def trace_session(device: str, out_dir: str, name: str, contents: tuple[str, ...] = (), level: str = "level0",
                  analysis: bool = True) -> Any:
    """A started-on-enter profiler context writing one trace of the ``with`` body into ``out_dir``."""
    record_shapes, memory, stack = "shapes" in contents, "memory" in contents, "stack" in contents
    if device == "npu":
        import torch_npu

        prof = torch_npu.profiler
        mstx = "mstx" in contents
        experimental = prof._ExperimentalConfig(profiler_level=getattr(prof.ProfilerLevel, npu_level(level)),
                                                mstx=mstx)
        session = prof.profile(activities=[prof.ProfilerActivity.CPU, prof.ProfilerActivity.NPU],
                               on_trace_ready=prof.tensorboard_trace_handler(out_dir, worker_name=name,
                                                                             analyse_flag=bool(analysis)),
                               record_shapes=record_shapes, profile_memory=memory, with_stack=stack,
                               experimental_config=experimental)
        if not mstx:
            return session
        stack_ = contextlib.ExitStack()
        stack_.enter_context(session)
        stack_.enter_context(_mstx_range(torch_npu, name))
        return stack_
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    import os

    def export(p) -> None:
        p.export_chrome_trace(os.path.join(out_dir, f"{name}.pt.trace.json"))

    return torch.profiler.profile(activities=activities, on_trace_ready=export, record_shapes=record_shapes,
                                  profile_memory=memory, with_stack=stack)


def trace_path(device: str, out_dir: str, name: str) -> str | None:
    """Where the trace of ``name`` was written: ``<name>.pt.trace.json`` (torch.profiler), or the newest
    ``<name>_<timestamp>_ascend_pt`` folder (torch_npu); None when nothing is there."""
    import glob
    import os

    if device != "npu":
        path = os.path.join(out_dir, f"{name}.pt.trace.json")
        return path if os.path.exists(path) else None
    found = sorted(glob.glob(os.path.join(out_dir, f"{glob.escape(name)}_*_ascend_pt")))
    return found[-1] if found else None


def nsys_range(name: str) -> contextlib.AbstractContextManager:
    return torch.cuda.nvtx.range(name)


def nsys_capture() -> tuple[Callable[[], None], Callable[[], None]]:
    return torch.cuda.profiler.start, torch.cuda.profiler.stop


def memory_history(device: str, enabled: bool, max_entries: int, stacks: str = "all", context: str = "all") -> None:
    """Start (or stop) the allocator's history recording for a memory snapshot."""
    module = torch.npu if device == "npu" else torch.cuda
    if device == "cpu":
        return  # the CPU allocator keeps no history
    if enabled:
        module.memory._record_memory_history(max_entries=max_entries, stacks=stacks, context=context)
    else:
        module.memory._record_memory_history(enabled=None)


def dump_memory_snapshot(device: str, path: str) -> bool:
    if device == "cpu":
        return False
    module = torch.npu if device == "npu" else torch.cuda
    module.memory._dump_snapshot(path)
    return True
