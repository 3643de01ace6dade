"""What an Ascend worker process must start with, and what vLLM-Ascend must be told, and why each setting is there.

Environment of a new worker process (:func:`worker_process_env`; torch_npu / CANN read these when they load, so
they must be in the process environment before ``import torch_npu``, that is in the launch script
``scripts/atlas/env.sh`` or Ray's runtime environment; setting them later from Python does nothing):

- ``TASK_QUEUE_ENABLE``: torch_npu's operator-dispatch queue (0 off, 1 on, 2 on with second-level pipelining; 1 is
  torch_npu's default). Level 2 is what vllm-ascend's tuning guide recommends; it raises peak memory a little, so
  the default here stays 1 and a value in the driver's environment is passed on to every worker.
- ``CPU_AFFINITY_CONF``: torch_npu's own core binding (0 off, 1 coarse: each process on the cores of its NPU's
  NUMA node, 2 fine-grained; read by libtorch_npu). It replaces vllm-ascend's ``enable_cpu_binding`` (below),
  which binds the whole process and so the trainer's threads. Passed on from the driver when set.
- ``HCCL_BUFFSIZE`` (MB per communicator, HCCL's default 200) and ``HCCL_HOST_SOCKET_PORT_RANGE`` /
  ``HCCL_NPU_SOCKET_PORT_RANGE``: passed on from the driver when set. When several processes share one NPU
  (``processes_per_device`` > 1) the port ranges default to ``auto``, so their HCCL listeners never ask for the
  same port (the fixed range derived from ``HCCL_IF_BASE_PORT`` is one per device).
- ``VLLM_ASCEND_ENABLE_NZ=0``: the variable that turned the FRACTAL_NZ weight layout off in vllm-ascend before
  0.20.2rc1; 0.20.2rc1-0.26.0rc1 read it only as a fallback for ``additional_config.weight_nz_mode``, and from
  0.27.1rc1 it is gone (:data:`npu_rl.device.ascend_matrix.NZ_VARIABLE_GONE_FROM`). It is still set for old
  releases; what decides on new ones is the engine argument below.

Engine arguments (:func:`ascend_additional_config`, merged into ``LLM(additional_config=...)`` on NPU):

- ``weight_nz_mode=0``: vllm-ascend (0.11 and later) casts linear weights to FRACTAL_NZ after loading when NZ is on
  (``AscendConfig.weight_nz_mode`` defaults to 1), and its ``NPUWorker.wake_up`` raises ``ValueError`` while it is
  non-zero: with sleep mode on (npu-rl's default) every step after the first sleep would fail. Loading weights in
  place (the ``load_weights`` sync path) also needs ND weights. Releases before 0.20.2rc1 read ``additional_config``
  keys with ``.get()`` and ignore unknown ones; 0.30's pydantic ``AscendConfig`` forbids unknown keys, and both keys
  here are its fields.
- ``enable_cpu_binding=False``: from 0.19.1rc1 vllm-ascend defaults it to True and ``taskset``\\ s the whole worker
  process after the model loads; our engine runs in the trainer's process, so that would pin the trainer's threads
  too.

:func:`effective_weight_nz_mode` says what a vllm-ascend release will really use, for the doctor and the weight
loading guard. Not set (they do nothing useful or harm): ``HCCL_EXEC_TIMEOUT=1800`` is *below* HCCL's default of
1836 s; ``HCCL_CONNECT_TIMEOUT`` (default 120 s) is raised in ``scripts/atlas/env.sh`` for large clusters.

None of this has run on an Ascend NPU here; the names and keys are checked against the real wheels
(tests/device/test_real_packages.py, recorded in ``npu_rl/device/ascend_facts.py``).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from npu_rl.device import ascend_matrix

logger = logging.getLogger(__name__)

TASK_QUEUE_VAR = "TASK_QUEUE_ENABLE"
NZ_VAR = "VLLM_ASCEND_ENABLE_NZ"
TASK_QUEUE_DEFAULT = "1"  # torch_npu's own default
NZ_KEY = "weight_nz_mode"
CPU_BINDING_KEY = "enable_cpu_binding"
PASSED_ON = ("CPU_AFFINITY_CONF", "HCCL_BUFFSIZE", "HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE")
PORT_RANGE_VARS = ("HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE")


def worker_process_env(device: str, *, sleep_mode: bool, processes_per_device: int = 1) -> dict[str, str]:
    """Variables a new worker process on ``device`` must start with (empty except on NPU)."""
    if device != "npu":
        return {}
    env = {TASK_QUEUE_VAR: os.environ.get(TASK_QUEUE_VAR, TASK_QUEUE_DEFAULT)}
    env.update({name: os.environ[name] for name in PASSED_ON if name in os.environ})
    if processes_per_device > 1:
        env.update({name: "auto" for name in PORT_RANGE_VARS if name not in env})
    # vllm-ascend < 0.27.1rc1 reads the variable (alone before 0.20.2rc1): keep it 0 unless a user chose NZ for a
    # run without sleep mode; newer releases take additional_config (ascend_additional_config).
    env[NZ_VAR] = os.environ.get(NZ_VAR, "0") if not sleep_mode else "0"
    return env


def set_nz_for_vllm(sleep_mode: bool) -> None:
    """In the worker, before vLLM-Ascend builds its layers (releases that still read the variable): NZ off when
    sleep mode is on (a user's 1 is overridden with a warning, since wake_up would raise); otherwise off unless the
    user chose a value."""
    old = os.environ.get(NZ_VAR)
    if sleep_mode:
        if old not in (None, "0"):
            logger.warning("%s=%s with vLLM sleep mode: vllm-ascend's wake_up refuses NZ weights; using 0", NZ_VAR,
                           old)
        os.environ[NZ_VAR] = "0"
    elif old is None:
        os.environ[NZ_VAR] = "0"


def _as_int(value: Any, where: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}={value!r} is not 0, 1 or 2") from None


def ascend_additional_config(*, sleep_mode: bool, user: Mapping[str, Any] | None = None,
                             env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``LLM(additional_config=...)`` for vLLM-Ascend: NZ off and vllm-ascend's process-wide CPU binding off, then
    the user's ``engine_kwargs.vllm.additional_config`` key by key. Without sleep mode a user's
    ``VLLM_ASCEND_ENABLE_NZ`` becomes the default ``weight_nz_mode`` (as before the variable went away). NZ on
    together with sleep mode is refused here, at start, instead of by ``wake_up`` after the first step."""
    env = os.environ if env is None else env
    nz_default = _as_int(env.get(NZ_VAR, "0"), NZ_VAR) if not sleep_mode else 0
    merged = {NZ_KEY: nz_default, CPU_BINDING_KEY: False, **dict(user or {})}
    nz = _as_int(merged[NZ_KEY], f"actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.{NZ_KEY}")
    if sleep_mode and nz != 0:
        raise ValueError(
            f"actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.{NZ_KEY}={merged[NZ_KEY]!r} with vLLM "
            "sleep mode (free_cache_engine=True): vllm-ascend's NPUWorker.wake_up raises while weight_nz_mode is not "
            f"0; drop the key (npu-rl sets {NZ_KEY}=0) or set actor_rollout_ref.rollout.free_cache_engine=False")
    return merged


def effective_weight_nz_mode(additional_config: Mapping[str, Any] | None, env: Mapping[str, str],
                             vllm_ascend_version: str | None) -> int:
    """The ``weight_nz_mode`` a vllm-ascend release will use: ``additional_config`` first (0.20.2rc1 and later),
    then ``VLLM_ASCEND_ENABLE_NZ`` where the release still reads it (before 0.27.1rc1, or an unknown version), then
    the default 1."""
    config = dict(additional_config or {})
    if NZ_KEY in config and ascend_matrix.reads_nz_key(vllm_ascend_version):
        return _as_int(config[NZ_KEY], f"additional_config.{NZ_KEY}")
    if ascend_matrix.reads_nz_variable(vllm_ascend_version) and NZ_VAR in env:
        return _as_int(env[NZ_VAR], NZ_VAR)
    return 1


def set_expandable_segments(enabled: bool) -> bool:
    """``torch.npu.memory._set_allocator_settings("expandable_segments:<enabled>")`` at run time (the environment's
    ``PYTORCH_NPU_ALLOC_CONF`` must not hold it with sleep mode: CaMemAllocator asserts so when it is built). A
    torch_npu without the call keeps its allocator as it is (logged once); returns whether the setting was made."""
    import torch

    memory = getattr(getattr(torch, "npu", None), "memory", None)
    setter = getattr(memory, "_set_allocator_settings", None)
    if setter is None:
        logger.warning("torch.npu.memory._set_allocator_settings is missing: expandable segments stay as they are")
        return False
    setter(f"expandable_segments:{bool(enabled)}")
    return True
