"""What a worker needs to know about the process group, with the single-process case costing nothing.

Workers call these instead of ``torch.distributed`` directly, so the same worker code runs in-process (world size
1, no process group) and as one Ray actor per device (the controller sets RANK / WORLD_SIZE / MASTER_ADDR).
"""

from __future__ import annotations

import os
import torch
import torch.distributed as dist

from npu_rl.device import get_backend

def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def init() -> None:
    """Initialise the process group from the environment when WORLD_SIZE > 1 (idempotent; under Ray the controller
    has already done it)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not is_distributed():
        backend = get_backend()
        backend.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend.dist_backend)


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def default_group():
    """The world group when distributed (data-parallel collectives), else None."""
    return dist.group.WORLD if is_distributed() else None


def all_reduce_sum(tensors: dict[str, torch.Tensor], group=None) -> dict[str, torch.Tensor]:
    """Sum 0-d tensors over ``group`` (default: all ranks) in one collective."""
    if not is_distributed():
        return tensors
    keys = list(tensors)
    stacked = torch.stack([tensors[k].float() for k in keys]).to(get_backend().device())
    dist.all_reduce(stacked, group=group)
    return {k: stacked[i] for i, k in enumerate(keys)}
