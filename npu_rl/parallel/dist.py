"""Process-group helpers, the one place that asks torch.distributed whether it is running and that starts it.

Workers call these instead of ``torch.distributed`` directly, so the same code runs in-process (world size 1, no
process group: every helper is then free) and as one Ray actor or torchrun process per device (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK`` set by the launcher).
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from npu_rl.device import Backend, get_backend


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def default_group():
    """The world group when distributed (data-parallel collectives), else None."""
    return dist.group.WORLD if is_distributed() else None


def init_distributed(backend: Backend | None = None, *, device_index: int | None = None, timeout_s: float = 1800.0,
                     single_process_group: bool = True) -> tuple[int, int]:
    """Initialise torch.distributed once per process with the device layer's backend (hccl | nccl | gloo) and
    select this rank's device; return ``(rank, world_size)``. Idempotent; the only initialiser in the package.

    Reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and ``LOCAL_RANK``. ``device_index`` defaults to
    ``LOCAL_RANK`` modulo the number of visible devices (0 when the launcher made one device visible per process).
    Alone (``WORLD_SIZE`` 1 and no ``MASTER_ADDR``): with ``single_process_group`` a one-rank group in memory, so the
    same FSDP2 / checkpoint code runs at world size 1; without it nothing is started (the workers' in-process case).
    """
    if is_distributed():
        return dist.get_rank(), dist.get_world_size()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 and "MASTER_ADDR" not in os.environ and not single_process_group:
        return 0, 1
    backend = backend or get_backend()
    rank_ = int(os.environ.get("RANK", "0"))
    if backend.is_accelerator:
        if device_index is None:
            device_index = int(os.environ.get("LOCAL_RANK", "0")) % max(backend.device_count(), 1)
        backend.set_device(device_index)
    timeout = datetime.timedelta(seconds=timeout_s)
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend.dist_backend, rank=rank_, world_size=world, timeout=timeout)
    elif world == 1:
        dist.init_process_group(backend.dist_backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        raise RuntimeError(f"WORLD_SIZE={world} but MASTER_ADDR is not set: launch with torchrun or Ray")
    return rank_, world


def all_reduce_sum(tensors: dict[str, torch.Tensor], group=None) -> dict[str, torch.Tensor]:
    """Sum 0-d tensors over ``group`` (default: all ranks) in one collective."""
    if not is_distributed():
        return tensors
    keys = list(tensors)
    stacked = torch.stack([tensors[k].float() for k in keys]).to(get_backend().device())
    dist.all_reduce(stacked, group=group)
    return {k: stacked[i] for i, k in enumerate(keys)}


def all_gather_objects(obj, group=None) -> list:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` alone."""
    if not is_distributed():
        return [obj]
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out
