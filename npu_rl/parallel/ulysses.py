"""Ulysses sequence parallelism: the collectives and the sequence split (DeepSpeed-Ulysses, arXiv:2309.14509).

The ``sp`` ranks of a group each hold ``1/sp`` of one packed sequence. Everything outside attention is per token,
so it runs on the local slice unchanged. Attention needs the whole sequence: an all-to-all turns sequence-sharded
q/k/v ``[*, S/sp, H, D]`` into head-sharded ``[*, S, H/sp, D]``, each rank attends over the full sequence for its
heads, and the reverse all-to-all brings the output back to ``[*, S/sp, H, D]``.

Conventions:

- The packed sequence is padded at the end to a multiple of ``sp`` (:class:`SequenceShard`); the padding is a
  separate segment in ``cu_seqlens``, so it attends only to itself and real tokens never see it.
- *Every* per-token tensor that meets the model's per-token outputs (labels, temperature, masks, position ids)
  must be sliced with the same :meth:`SequenceShard.shard`. verl #5957 sliced the inputs but not a per-token
  temperature, which broke Ulysses + remove-padding on NPU; ``PackedInputs.slice`` in
  :mod:`npu_rl.parallel.packing` is the one place that does it here.
- :func:`gather_sequence` all-gathers per-token outputs (log-probs, values) back to the full sequence; its backward
  keeps the local slice of the gradient. That is exact when the loss computed from the gathered tensor is the
  same on every rank of the group (it is: same inputs), and each rank's parameter gradient is then the part due to
  its tokens, which is why FSDP's divide factor is ``dp`` rather than ``dp * sp`` (:mod:`npu_rl.parallel.fsdp`).
- Heads: ``num_heads`` must divide by ``sp``. KV heads that do not divide by ``sp`` are repeated
  (GQA groups stay aligned) when ``sp`` is a multiple of their count; other combinations are rejected.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    size = dist.get_world_size(group)
    send = torch.stack([c.contiguous() for c in x.chunk(size, dim=scatter_dim)])  # [size, ...] piece i -> rank i
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather_dim)  # pieces from ranks 0..size-1, in order


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, gather_dim, scatter_dim, ctx.group), None, None, None


def all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    """Split ``x`` along ``scatter_dim`` over the group, concatenate what arrives along ``gather_dim``
    (autograd: the backward is the reverse exchange). ``x.size(scatter_dim)`` must divide by the group size."""
    size = dist.get_world_size(group)
    if x.size(scatter_dim) % size:
        raise ValueError(f"all_to_all: dim {scatter_dim} of size {x.size(scatter_dim)} does not divide by {size}")
    return _AllToAll.apply(x, scatter_dim, gather_dim, group)


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        ctx.rank, ctx.local = dist.get_rank(group), x.size(dim)
        pieces = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, x.contiguous(), group=group)
        return torch.cat(pieces, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        return grad.narrow(ctx.dim, ctx.rank * ctx.local, ctx.local).contiguous(), None, None


def gather_sequence(x: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    """All-gather equal local slices along ``dim`` (autograd; see the module docstring for the gradient)."""
    return _GatherSequence.apply(x, dim, group)


def kv_repeat_factor(num_heads: int, num_kv_heads: int, sp_size: int) -> int:
    """How many times to repeat each KV head so the heads split evenly over ``sp_size`` ranks (1: no repeat).
    Raises a clear error for layouts Ulysses cannot split."""
    if num_heads % sp_size:
        raise ValueError(
            f"ulysses_sequence_parallel_size={sp_size} must divide the number of attention heads ({num_heads})"
        )
    if num_kv_heads % sp_size == 0:
        return 1
    if sp_size % num_kv_heads == 0:
        return sp_size // num_kv_heads
    raise ValueError(
        f"ulysses_sequence_parallel_size={sp_size} and {num_kv_heads} KV heads: one must divide the other"
    )


def heads_from_sequence(x: torch.Tensor, group: dist.ProcessGroup, *, repeat: int = 1) -> torch.Tensor:
    """``[B, H, S/sp, D]`` (HF's attention layout) -> ``[B, H/sp, S, D]``; KV heads repeated ``repeat`` times
    first (``repeat_interleave`` keeps each query group next to its KV head)."""
    if repeat > 1:
        x = x.repeat_interleave(repeat, dim=1)
    return all_to_all(x, scatter_dim=1, gather_dim=2, group=group)


def sequence_from_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``[B, S, H/sp, D]`` (attention output layout) -> ``[B, S/sp, H, D]``."""
    return all_to_all(x, scatter_dim=1, gather_dim=2, group=group)


@dataclass
class SequenceShard:
    """How a packed sequence of ``total`` tokens is padded and split over the sp group."""

    total: int
    group: dist.ProcessGroup

    def __post_init__(self):
        self.size = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self.padded_total = -(-self.total // self.size) * self.size
        self.local_len = self.padded_total // self.size

    @property
    def pad_len(self) -> int:
        return self.padded_total - self.total

    def shard(self, x: torch.Tensor, dim: int = 1, pad_value: float = 0) -> torch.Tensor:
        """This rank's slice of a full per-token tensor (``x.size(dim) == total``), padded first."""
        if x.size(dim) != self.total:
            raise ValueError(f"shard: dim {dim} has {x.size(dim)} tokens, the packed sequence has {self.total}")
        if self.pad_len:
            shape = list(x.shape)
            shape[dim] = self.pad_len
            x = torch.cat([x, x.new_full(shape, pad_value)], dim=dim)
        return x.narrow(dim, self.rank * self.local_len, self.local_len)

    def gather(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """The full per-token tensor from the local slices, padding removed (autograd)."""
        return gather_sequence(x, dim, self.group).narrow(dim, 0, self.total)
