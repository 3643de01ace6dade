"""Profiling and precision dumps of chosen steps and roles (verl's ``global_profiler`` / per-role ``profiler`` keys).

The trainer asks :class:`StepProfiler` for a context around each profiled step (:meth:`StepProfiler.step`) and
around each phase of the step (:meth:`StepProfiler.phase`, through the phase timer). A phase belongs to a role and a
precision-debugger stage (:data:`PHASES`); only phases of roles with ``profiler.enable=True`` are profiled, only in
``global_profiler.steps``, only on the ranks the role names (rank 0 by default, every rank with ``all_ranks``).

Tools (``global_profiler.tool``, or a role's own ``profiler.tool``):

- ``torch`` / ``npu``: one trace per phase, ``<save_path>/step_<n>/<phase>_rank<r>.pt.trace.json`` (chrome trace;
  open in Perfetto or chrome://tracing). On Ascend both use ``torch_npu.profiler`` (the trace is then a
  ``*_ascend_pt`` folder per phase, for MindStudio Insight).
- ``nsys`` (CUDA): an NVTX range per phase and ``cudaProfilerStart/Stop`` around each profiled step; run the
  trainer under ``nsys profile --capture-range=cudaProfilerApi``.
- ``torch_memory`` (CUDA / NPU): allocator history over the step, ``<save_path>/step_<n>/memory_rank<r>.pickle``
  (open in pytorch.org/memory_viz).
- ``precision_debugger``: msprobe's ``PrecisionDebugger`` (``pip install mindstudio-probe``) started around each
  selected stage; one dump per step in ``<save_path>/msprobe/step<n>/rank<r>/dump.json`` (task ``statistics``:
  max/min/mean/norm of every input and output of every torch API call; ``tensor``: the tensors as .npy/.pt too),
  and ``<save_path>/msprobe/stages.jsonl`` saying which stages of which step it holds.

Profiling happens in the process that runs the phase. With the in-process worker group that is the trainer's own
process (every role); with Ray workers only the driver's side of each phase is seen (not run with Ray here).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Iterator

from npu_rl.config.profiler_schema import role_profilers, uses_precision_debugger  # noqa: F401 (re-export)
from npu_rl.device import profiler_backend as dev

logger = logging.getLogger(__name__)

# phase (PhaseTimer name) -> (role whose profiler config decides, verl's precision-debugger stage)
PHASES = {
    "gen": ("rollout", "rollout_generate"),
    "gen_max": ("rollout", "rollout_generate"),
    "reward": ("reward_model", "compute_rm_score"),
    "old_log_prob": ("actor", "actor_compute_log_prob"),
    "ref": ("ref", "ref_compute_log_prob"),
    "values": ("critic", "compute_values"),
    "update_critic": ("critic", "critic_update"),
    "update_actor": ("actor", "actor_update"),
}
STAGES = sorted({stage for _, stage in PHASES.values()} - {"rollout_generate"})  # msprobe cannot hook vLLM's run


def check_profiler_config(config, device: str) -> list[str]:
    """Problems with the profiler keys (empty when fine or off); the validator reports them."""
    glob = config.global_profiler
    roles = role_profilers(config)
    problems = []
    tools = {glob.tool} | {p.tool for p in roles.values() if p.enable}
    tools.discard(None)
    for tool in sorted(tools):
        if tool not in dev.ALL_TOOLS:
            problems.append(f"global_profiler.tool={tool!r}: expected one of torch, npu, nsys, torch_memory, "
                            "precision_debugger")
            continue
        try:
            dev.check_tool(tool, device)
        except ValueError as exc:
            problems.append(str(exc))
    if tools and not glob.steps:
        problems.append("global_profiler.steps is empty: name the global steps to profile, e.g. [1,2]")
    if tools and not any(p.enable for p in roles.values()):
        problems.append("a profiler tool is set but no role has profiler.enable=True (e.g. "
                        "actor_rollout_ref.actor.profiler.enable=True): nothing would be profiled")
    debugger = glob.global_tool_config.precision_debugger
    if "precision_debugger" in tools:
        unknown = set(debugger.stages or ()) - set(STAGES)
        if unknown and debugger.strict:
            problems.append(f"global_profiler.global_tool_config.precision_debugger.stages: unknown {sorted(unknown)}"
                            f"; expected some of {', '.join(STAGES)}")
        if debugger.task not in ("statistics", "tensor"):
            problems.append(f"precision_debugger.task={debugger.task!r}: expected statistics or tensor")
        if debugger.level != "L1":
            problems.append(f"precision_debugger.level={debugger.level!r}: npu-rl drives msprobe at L1 (API level);"
                            " L0 / mix bind one module, which npu-rl does not do")
        try:
            import msprobe  # noqa: F401
        except ImportError:
            problems.append("global_profiler.tool=precision_debugger needs msprobe: pip install mindstudio-probe")
    return problems


class StepProfiler:
    def __init__(self, config, run_dir: str, rank: int = 0, device: str = "cpu"):
        self.glob = config.global_profiler
        self.roles = role_profilers(config)
        self.rank, self.device = rank, device
        self.save_path = os.path.abspath(self.glob.save_path or os.path.join(run_dir, "profile"))
        self.steps = set(self.glob.steps or ())
        self._step: int | None = None
        self._debugger = None
        self._debugger_step: int | None = None
        self.written: list[str] = []  # files / folders produced, for the log and tests

    # ------------------------------------------------------------------------------------------------ selection
    def _tool(self, role: str) -> str | None:
        prof = self.roles.get(role)
        if prof is None or not prof.enable:
            return None
        if not (prof.all_ranks or self.rank in (prof.ranks or [0])):
            return None
        return prof.tool or self.glob.tool

    @property
    def enabled(self) -> bool:
        return bool(self.steps) and any(self._tool(role) for role in self.roles)

    def _contents(self, role: str, tool: str) -> tuple[str, ...]:
        cfg = getattr(self.roles[role].tool_config, tool, None)
        return tuple(getattr(cfg, "contents", None) or ())

    def _stage_selected(self, stage: str) -> bool:
        stages = self.glob.global_tool_config.precision_debugger.stages
        return stage in STAGES and (stages is None or stage in stages)

    # ------------------------------------------------------------------------------------------------ contexts
    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        if not self.enabled or step not in self.steps:
            yield
            return
        self._step = step
        tools = {self._tool(role) for role in self.roles} - {None}
        step_dir = os.path.join(self.save_path, f"step_{step}")
        os.makedirs(step_dir, exist_ok=True)
        stop = None
        if "nsys" in tools:
            start, stop = dev.nsys_capture()
            start()
        if "torch_memory" in tools:
            mem = self.glob.global_tool_config.torch_memory
            dev.memory_history(self.device, True, mem.trace_alloc_max_entries, mem.stacks, mem.context)
        try:
            yield
        finally:
            if stop is not None:
                stop()
            if "torch_memory" in tools:
                path = os.path.join(step_dir, f"memory_rank{self.rank}.pickle")
                if dev.dump_memory_snapshot(self.device, path):
                    self.written.append(path)
                dev.memory_history(self.device, False, 0)
            if self._debugger is not None:
                self._debugger.step()
            self._step = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        role, stage = PHASES.get(name, (None, None))
        tool = self._tool(role) if (self._step is not None and role) else None
        if tool in dev.TRACE_TOOLS:
            out_dir = os.path.join(self.save_path, f"step_{self._step}")
            npu = self.roles[role].tool_config.npu  # verl's level / analysis (used on Ascend only)
            trace = f"{name}_rank{self.rank}"
            with dev.trace_session(self.device, out_dir, trace, self._contents(role, tool), level=npu.level,
                                   analysis=npu.analysis):
                yield
            self.written.append(dev.trace_path(self.device, out_dir, trace) or os.path.join(out_dir, trace))
        elif tool == "nsys":
            with dev.nsys_range(name):
                yield
        elif tool == "precision_debugger" and self._stage_selected(stage):
            debugger = self._msprobe()
            debugger.start()
            try:
                yield
            finally:
                debugger.stop()
                self._index(stage, name)
        else:
            yield

    # ------------------------------------------------------------------------------------------------ msprobe
    def _msprobe(self):
        if self._debugger is None:
            from msprobe.pytorch import PrecisionDebugger

            dbg = self.glob.global_tool_config.precision_debugger
            dump_path = os.path.join(self.save_path, "msprobe")
            os.makedirs(dump_path, exist_ok=True)
            if dbg.config_path:
                with open(os.path.expanduser(dbg.config_path), encoding="utf-8") as f:
                    ms_config = json.load(f)
            else:
                ms_config = {"task": dbg.task, "rank": list(dbg.ranks), "step": [], "level": dbg.level,
                             dbg.task: {"scope": [], "list": [], "data_mode": ["all"]}}
                if dbg.task == "statistics":
                    ms_config["statistics"]["summary_mode"] = "statistics"
            ms_config["dump_path"] = dump_path
            path = os.path.join(dump_path, "msprobe_config.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(ms_config, f, indent=1)
            self._debugger = PrecisionDebugger(config_path=path)
        if self._debugger_step != self._step:  # msprobe's step folders carry the trainer's global step
            self._debugger.set_init_step(self._step)
            self._debugger_step = self._step
        return self._debugger

    def _index(self, stage: str, phase: str) -> None:
        path = os.path.join(self.save_path, "msprobe", "stages.jsonl")
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": self._step, "stage": stage, "phase": phase, "rank": self.rank}) + "\n")
        folder = os.path.join(self.save_path, "msprobe", f"step{self._step}")
        if folder not in self.written:
            self.written.append(folder)
