"""Environment an Ascend worker process must have when it starts, and why each variable is there.

Only settings that change something are listed (issue 12, break 8):

- ``TASK_QUEUE_ENABLE``: torch_npu's operator-dispatch queue (0 off, 1 on, 2 on with second-level pipelining; 1 is
  torch_npu's default). torch_npu reads it once, when it is imported, so it must be in the process environment
  before ``import torch_npu``: in the launch script (``scripts/atlas/env.sh``) or Ray's runtime environment. Setting
  it later from Python (as this repository once did in its NPU patches) does nothing. Level 2 is what vllm-ascend's
  tuning guide recommends; it raises peak memory a little, so the default here stays torch_npu's 1 and a value in
  the driver's environment is passed on to every worker.
- ``VLLM_ASCEND_ENABLE_NZ=0`` whenever vLLM's sleep mode is on: vllm-ascend (0.11 and later) casts linear weights to
  the FRACTAL_NZ layout after loading, and its ``NPUWorker.wake_up`` raises ``ValueError`` ("FRACTAL_NZ mode is
  enabled ... set VLLM_ASCEND_ENABLE_NZ=0") whenever NZ is on. In-place weight loading (the ``load_weights``
  weight-sync path) also needs ND weights. vllm-ascend reads the variable when the engine builds its layers, so
  setting it in the worker before the engine starts works; Ray's runtime environment sets it for every worker too.

Not set (they do nothing useful or harm): ``HCCL_EXEC_TIMEOUT=1800`` is *below* HCCL's default of 1836 s, so the
old "raise it" comment was wrong; ``HCCL_CONNECT_TIMEOUT`` (default 120 s) is raised in ``scripts/atlas/env.sh``
for large clusters, where links take longer to come up.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

TASK_QUEUE_VAR = "TASK_QUEUE_ENABLE"
NZ_VAR = "VLLM_ASCEND_ENABLE_NZ"
TASK_QUEUE_DEFAULT = "1"  # torch_npu's own default


def worker_process_env(device: str, *, sleep_mode: bool) -> dict[str, str]:
    """Variables a new worker process on ``device`` must start with (empty except on NPU)."""
    if device != "npu":
        return {}
    env = {TASK_QUEUE_VAR: os.environ.get(TASK_QUEUE_VAR, TASK_QUEUE_DEFAULT)}
    if sleep_mode:
        env[NZ_VAR] = "0"
    elif NZ_VAR in os.environ:
        env[NZ_VAR] = os.environ[NZ_VAR]
    else:
        env[NZ_VAR] = "0"  # the load_weights weight-sync path needs ND weights too
    return env


def set_nz_for_vllm(sleep_mode: bool) -> None:
    """In the worker, before vLLM-Ascend builds its layers: NZ off when sleep mode is on (a user's 1 is overridden
    with a warning, since wake_up would raise); otherwise off unless the user chose a value."""
    old = os.environ.get(NZ_VAR)
    if sleep_mode:
        if old not in (None, "0"):
            logger.warning("%s=%s with vLLM sleep mode: vllm-ascend's wake_up refuses NZ weights; using 0", NZ_VAR,
                           old)
        os.environ[NZ_VAR] = "0"
    elif old is None:
        os.environ[NZ_VAR] = "0"
