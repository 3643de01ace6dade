"""The device a run asks for (``trainer.device``; ``DEVICE`` in the environment wins over ``auto``), how many are
visible, and the profiler tools that device has (``check_device``)."""

from __future__ import annotations

import os

from npu_rl.config.schema import PPOConfig
from npu_rl.device import select_backend
from npu_rl.trainer.checks.pools import pool_device_problems
from npu_rl.trainer.profiling import check_profiler_config


def device_problems(config: PPOConfig) -> list[str]:
    requested = config.trainer.device
    try:
        backend = select_backend(requested if requested != "auto" else None)
    except (RuntimeError, ValueError) as exc:
        return [f"trainer.device: {exc}"]
    problems = list(check_profiler_config(config, backend.name))
    if backend.is_accelerator and config.trainer.nnodes == 1:
        have = backend.device_count()
        if config.trainer.n_gpus_per_node > have:
            problems.append(f"trainer.n_gpus_per_node={config.trainer.n_gpus_per_node} but only {have} {backend.name} "
                            f"device(s) are visible ({backend.visible_devices_env}="
                            f"{os.environ.get(backend.visible_devices_env)})")
    if backend.is_accelerator:
        problems += pool_device_problems(config, backend.name, backend.device_count(), backend.visible_devices_env)
    return problems
