"""Profiler and precision-debugger keys, with verl's names (``global_profiler`` and each role's ``profiler``).

verl's generated ppo_trainer.yaml has ``global_profiler: {tool, steps, profile_continuous_steps, save_path,
global_tool_config: {nsys, torch_memory, precision_debugger}}`` and, under actor / ref / rollout / critic /
reward_model, ``profiler: {tool, enable, all_ranks, ranks, save_path, tool_config}``. The mechanism is
``npu_rl/trainer/profiling.py``; what each tool writes is in docs/npu.md ("Profiling and precision dumps").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

@dataclass
class RoleTorchToolConfig:
    contents: list[str] = field(default_factory=list)
    """read: shapes, memory, stack"""
    discrete: bool = False
    """npu-rl writes one trace per phase either way"""
    schedule: dict[str, Any] = field(default_factory=dict)
    """verl's torch schedule; not used (phases are ranged)"""


@dataclass
class RoleNpuToolConfig:
    contents: list[str] = field(default_factory=list)
    """read: shapes, memory, stack, mstx"""
    level: str = "level0"
    """level0 | level1 | level2 | level_none (torch_npu's ProfilerLevel)"""
    analysis: bool = True
    """parse the raw data at the end of each phase (tensorboard_trace_handler's analyse_flag)"""
    discrete: bool = False


@dataclass
class RoleNsysToolConfig:
    discrete: bool = False


@dataclass
class RoleTorchMemoryToolConfig:
    trace_alloc_max_entries: int = 100000
    stack_depth: int = 32


@dataclass
class RolePrecisionDebuggerToolConfig:
    config_path: Optional[str] = None
    steps: Optional[list[int]] = None
    stages: Optional[list[str]] = None
    strict: bool = False


@dataclass
class RoleToolConfig:
    nsys: RoleNsysToolConfig = field(default_factory=RoleNsysToolConfig)
    npu: RoleNpuToolConfig = field(default_factory=RoleNpuToolConfig)
    torch: RoleTorchToolConfig = field(default_factory=RoleTorchToolConfig)
    torch_memory: RoleTorchMemoryToolConfig = field(default_factory=RoleTorchMemoryToolConfig)
    precision_debugger: RolePrecisionDebuggerToolConfig = field(default_factory=RolePrecisionDebuggerToolConfig)


@dataclass
class RoleProfilerConfig:
    tool: Optional[str] = "${oc.select:global_profiler.tool,null}"
    """null: global_profiler.tool"""
    enable: bool = False
    """this role's phases are profiled in global_profiler.steps"""
    all_ranks: bool = False
    ranks: list[int] = field(default_factory=list)
    """empty and not all_ranks: rank 0 only"""
    save_path: Optional[str] = "${oc.select:global_profiler.save_path,null}"
    tool_config: RoleToolConfig = field(default_factory=RoleToolConfig)
    """verl's per-tool options; npu-rl reads tool_config.torch.contents and tool_config.npu.contents"""


@dataclass
class NsysToolConfig:
    discrete: bool = False
    controller_nsight_options: dict[str, Any] = field(default_factory=dict)
    """for `nsys profile` on the driver"""
    worker_nsight_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class TorchMemoryToolConfig:
    trace_alloc_max_entries: int = 100000
    stack_depth: int = 32
    context: str = "all"
    stacks: str = "all"
    kw_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class PrecisionDebuggerToolConfig:
    """msprobe (mindstudio-probe) ``PrecisionDebugger``. With ``config_path`` null, npu-rl writes msprobe's config
    from ``task`` / ``level`` / ``ranks`` (its own keys, not verl's)."""

    config_path: Optional[str] = None
    """an msprobe config.json of your own (its dump_path is replaced)"""
    steps: Optional[list[int]] = None
    """deprecated in verl: global_profiler.steps decides"""
    stages: Optional[list[str]] = None
    """actor_update, actor_compute_log_prob, ref_compute_log_prob, compute_values, critic_update, compute_rm_score;
    null: every enabled role's"""
    strict: bool = False
    """unknown stages: error instead of warning"""
    task: str = "statistics"
    """npu-rl: statistics (max/min/mean/norm per tensor) | tensor (the tensors themselves)"""
    level: str = "L1"
    """npu-rl: L1 (every torch API call); L0 / mix need the module, which npu-rl does not bind"""
    ranks: list[int] = field(default_factory=list)
    """npu-rl: msprobe's "rank" ([] = every rank)"""


@dataclass
class GlobalToolConfig:
    nsys: NsysToolConfig = field(default_factory=NsysToolConfig)
    torch_memory: TorchMemoryToolConfig = field(default_factory=TorchMemoryToolConfig)
    precision_debugger: PrecisionDebuggerToolConfig = field(default_factory=PrecisionDebuggerToolConfig)


@dataclass
class GlobalProfilerConfig:
    tool: Optional[str] = None
    """torch | npu | nsys | torch_memory | precision_debugger; null: off"""
    steps: Optional[list[int]] = None
    """global steps to profile (1-based, as trainer.global_step)"""
    profile_continuous_steps: bool = False
    """verl: one trace across consecutive steps; npu-rl writes one per step"""
    save_path: Optional[str] = None
    """verl: outputs/profile; npu-rl: null = <run folder>/profile"""
    global_tool_config: GlobalToolConfig = field(default_factory=GlobalToolConfig)


def role_profilers(config) -> dict[str, Any]:
    """Each role's ``profiler`` section by role name."""
    arr = config.actor_rollout_ref
    return {"actor": arr.actor.profiler, "ref": arr.ref.profiler, "rollout": arr.rollout.profiler,
            "critic": config.critic.profiler, "reward_model": config.reward_model.profiler}


def uses_precision_debugger(config) -> bool:
    """Whether msprobe's precision dumps are on (globally or for a role). msprobe wraps torch's APIs and refuses
    TorchDynamo (torch >= 2.7), so such a run compiles nothing (``RunSettings.allow_compile``)."""
    tools = {config.global_profiler.tool} | {p.tool for p in role_profilers(config).values() if p.enable}
    return "precision_debugger" in tools
