"""Process group and device mesh: ``dp x sp`` for data, and the FSDP mesh for parameters.

Layout of the ``world_size = dp * sp`` ranks: sequence-parallel groups are consecutive ranks (sp innermost), so on a
node of 8 devices with sp=4, ranks 0-3 share one sequence and 4-7 another, and the all-to-all stays inside a node.

- ``device_mesh`` ("dp", "sp"): which data shard a rank holds (``dp_rank``) and its Ulysses group (``sp_group``).
- ``fsdp_mesh``: the parameter sharding. Parameters are sharded over *all* ranks, sp ranks included (they run the
  same model on different parts of a sequence). ``fsdp_size`` (``fsdp_config.fsdp_size``): -1 or the world size
  shards over every rank (1D mesh ("fsdp",)); a proper divisor of the world size gives HSDP, a 2D mesh
  ("ddp", "fsdp") that shards within groups of ``fsdp_size`` ranks and replicates across groups (cheaper
  all-gathers inside a node, more memory). Anything else is rejected.
- ``ep_mesh`` / ``efsdp_mesh`` (``fsdp_config.expert_parallel_size`` > 1, see ``parallel/expert_parallel.py``): the
  experts of every MoE layer split over ``ep`` consecutive ranks (innermost, like sp, so the token all-to-all
  stays inside a node), and FSDP2 over the ``efsdp = world / ep`` ranks holding the same experts. The three are
  cut from one root mesh ("efsdp", "ep") whose flattened form is the FSDP mesh of the other weights, as FSDP2
  requires of a parameter that is already a DTensor (it concatenates the efsdp and ep meshes). EP with HSDP
  (``fsdp_size`` a proper divisor) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from npu_rl.protocol import DispatchLayout
from npu_rl.device import Backend, get_backend
from npu_rl.parallel.dist import init_distributed


@dataclass
class ParallelMesh:
    """The meshes one role uses. Build it with :func:`build_mesh`."""

    device_mesh: DeviceMesh  # ("dp", "sp")
    fsdp_mesh: DeviceMesh  # ("fsdp",) or ("ddp", "fsdp") for HSDP
    ep_mesh: DeviceMesh | None = None  # ("ep",): ranks that split the experts; None without expert parallelism
    efsdp_mesh: DeviceMesh | None = None  # ("efsdp",): ranks holding the same experts (FSDP2 shards them there)

    @property
    def world_size(self) -> int:
        return self.device_mesh.size()

    @property
    def dp_size(self) -> int:
        return self.device_mesh.size(0)

    @property
    def sp_size(self) -> int:
        return self.device_mesh.size(1)

    @property
    def dp_rank(self) -> int:
        return self.device_mesh.get_local_rank("dp")

    @property
    def sp_rank(self) -> int:
        return self.device_mesh.get_local_rank("sp")

    @property
    def dp_group(self) -> dist.ProcessGroup:
        return self.device_mesh.get_group("dp")

    @property
    def sp_group(self) -> dist.ProcessGroup | None:
        """The Ulysses group, or None when sp is 1 (nothing to exchange)."""
        return self.device_mesh.get_group("sp") if self.sp_size > 1 else None

    @property
    def ep_size(self) -> int:
        return self.ep_mesh.size() if self.ep_mesh is not None else 1

    @property
    def is_hsdp(self) -> bool:
        return self.fsdp_mesh.ndim == 2

    def dispatch_layout(self) -> DispatchLayout:
        """For ``DP_SPLIT``: ranks of one sp group get the same shard; sp rank 0 returns the group's output."""
        return DispatchLayout(self.dp_rank, self.dp_size, self.sp_rank == 0)

    def __repr__(self) -> str:
        fsdp = "x".join(map(str, self.fsdp_mesh.shape))
        ep = f", ep={self.ep_size}" if self.ep_mesh is not None else ""
        return f"ParallelMesh(world={self.world_size}, dp={self.dp_size}, sp={self.sp_size}, fsdp={fsdp}{ep})"


def check_parallel_sizes(world_size: int, sp_size: int = 1, fsdp_size: int = -1,
                         ep_size: int = 1) -> tuple[int, int]:
    """Validate the sizes (no process group needed); return ``(dp_size, fsdp_shard_size)``."""
    if sp_size < 1 or world_size % sp_size:
        raise ValueError(
            f"ulysses_sequence_parallel_size={sp_size} must be >= 1 and divide the number of devices ({world_size})"
        )
    if ep_size < 1 or world_size % ep_size:
        raise ValueError(f"fsdp_config.expert_parallel_size={ep_size} must be >= 1 and divide the number of devices "
                         f"({world_size})")
    if ep_size > 1 and fsdp_size not in (-1, world_size):
        raise ValueError(f"fsdp_config.expert_parallel_size={ep_size} with fsdp_config.fsdp_size={fsdp_size} (HSDP) "
                         "is not supported: set fsdp_size to -1")
    if fsdp_size == -1 or fsdp_size == world_size:
        return world_size // sp_size, world_size
    if fsdp_size < 1 or fsdp_size > world_size or world_size % fsdp_size:
        raise ValueError(
            f"fsdp_config.fsdp_size={fsdp_size} is invalid for {world_size} devices: use -1 (shard over all), or a "
            f"divisor of {world_size} for HSDP (shard within groups of fsdp_size, replicate across them)"
        )
    return world_size // sp_size, fsdp_size


def build_mesh(sp_size: int = 1, fsdp_size: int = -1, backend: Backend | None = None,
               ep_size: int = 1) -> ParallelMesh:
    """The meshes for ``ulysses_sequence_parallel_size``, ``fsdp_config.fsdp_size`` and
    ``fsdp_config.expert_parallel_size`` over the whole world. Calls :func:`init_distributed` if needed; collective
    (every rank must call it)."""
    backend = backend or get_backend()
    init_distributed(backend)
    world_size = dist.get_world_size()
    dp_size, shard_size = check_parallel_sizes(world_size, sp_size, fsdp_size, ep_size)
    device_mesh = init_device_mesh(backend.name, (dp_size, sp_size), mesh_dim_names=("dp", "sp"))
    if ep_size > 1:
        root = init_device_mesh(backend.name, (world_size // ep_size, ep_size), mesh_dim_names=("efsdp", "ep"))
        return ParallelMesh(device_mesh, root._flatten("fsdp"), ep_mesh=root["ep"], efsdp_mesh=root["efsdp"])
    if shard_size == world_size:
        fsdp_mesh = init_device_mesh(backend.name, (world_size,), mesh_dim_names=("fsdp",))
    else:
        fsdp_mesh = init_device_mesh(backend.name, (world_size // shard_size, shard_size),
                                     mesh_dim_names=("ddp", "fsdp"))
    return ParallelMesh(device_mesh, fsdp_mesh)
