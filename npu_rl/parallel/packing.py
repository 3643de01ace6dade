"""Remove-padding (``model.use_remove_padding``): a padded ``[B, T]`` batch as one packed sequence ``[1, total]``.

Only valid tokens are computed. Position ids restart at 0 for every sequence (for left padding they equal HF's
``cumsum(mask) - 1``), and ``cu_seqlens`` (``[0, len_0, len_0 + len_1, ...]``, int32) tells the attention where each
sequence starts, so attention stays inside a sequence (:mod:`npu_rl.parallel.attention`). A row's valid tokens
need not be contiguous (``prompt pad response`` works: they are packed in order).

Usage in a worker (the same code with or without Ulysses)::

    inputs = prepare_packed_inputs(input_ids, attention_mask, sp_group=mesh.sp_group)   # [B, T] -> local [1, L]
    labels = inputs.slice(torch.roll(input_ids, -1, dims=1))    # every per-token tensor goes through slice()
    temperature = inputs.slice(temperature_per_token)            # (verl #5957 forgot this one)
    with inputs.attention():
        logits = model(input_ids=inputs.input_ids, position_ids=inputs.position_ids, use_cache=False).logits
    logprobs = inputs.restore(logprobs_from(logits / temperature[..., None], labels))  # [B, T], 0 on padding
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from npu_rl.parallel.attention import VarlenLayout, varlen_attention
from npu_rl.parallel.ulysses import SequenceShard


@dataclass
class PackedSequences:
    input_ids: torch.Tensor  # [1, total]
    position_ids: torch.Tensor  # [1, total]
    cu_seqlens: torch.Tensor  # [B + 1] int32
    seqlens: list[int]  # [B], host
    indices: torch.Tensor  # [total]: positions of the valid tokens in the flattened [B * T]
    batch_size: int
    seq_len: int

    @property
    def total(self) -> int:
        return self.indices.numel()

    @property
    def max_seqlen(self) -> int:
        return max(self.seqlens, default=0)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """A per-token tensor ``[B, T, ...]`` -> ``[1, total, ...]`` in packed order."""
        if tuple(x.shape[:2]) != (self.batch_size, self.seq_len):
            raise ValueError(f"unpad: expected [{self.batch_size}, {self.seq_len}, ...], got {tuple(x.shape)}")
        return x.reshape(-1, *x.shape[2:])[self.indices].unsqueeze(0)

    def pad(self, x: torch.Tensor, pad_value: float = 0) -> torch.Tensor:
        """``[1, total, ...]`` or ``[total, ...]`` -> ``[B, T, ...]``, ``pad_value`` on padding (autograd)."""
        flat = x[0] if x.dim() >= 2 and x.size(0) == 1 and x.size(1) == self.total else x
        if flat.size(0) != self.total:
            raise ValueError(f"pad: expected {self.total} tokens, got shape {tuple(x.shape)}")
        out = flat.new_full((self.batch_size * self.seq_len, *flat.shape[1:]), pad_value)
        out = out.index_put((self.indices,), flat)
        return out.view(self.batch_size, self.seq_len, *flat.shape[1:])


def unpad_input(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor | None = None) -> PackedSequences:
    """Pack the valid tokens of ``input_ids [B, T]``; ``position_ids [B, T]`` are packed too when given (e.g.
    from the dataset), else restart at 0 per sequence."""
    batch_size, seq_len = input_ids.shape
    mask = attention_mask.bool()
    indices = mask.reshape(-1).nonzero(as_tuple=True)[0]
    lengths = mask.sum(dim=1)
    seqlens = lengths.tolist()
    cu_seqlens = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    if position_ids is None:
        starts = torch.repeat_interleave(cu_seqlens[:-1].long(), lengths)
        packed_positions = torch.arange(indices.numel(), device=input_ids.device) - starts
    else:
        packed_positions = position_ids.reshape(-1)[indices]
    return PackedSequences(
        input_ids=input_ids.reshape(-1)[indices].unsqueeze(0),
        position_ids=packed_positions.unsqueeze(0),
        cu_seqlens=cu_seqlens,
        seqlens=seqlens,
        indices=indices,
        batch_size=batch_size,
        seq_len=seq_len,
    )


def pad_output(x: torch.Tensor, packed: PackedSequences, pad_value: float = 0) -> torch.Tensor:
    """``[1, total, ...]`` -> ``[B, T, ...]`` (see :meth:`PackedSequences.pad`)."""
    return packed.pad(x, pad_value)


@dataclass
class PackedInputs:
    """A batch ready for the packed forward on this rank: ``input_ids`` / ``position_ids`` are ``[1, L]``, the
    whole packed sequence (no sp) or this rank's slice of it (Ulysses)."""

    packed: PackedSequences
    shard: SequenceShard | None
    input_ids: torch.Tensor
    position_ids: torch.Tensor

    def slice(self, x: torch.Tensor, pad_value: float = 0) -> torch.Tensor:
        """A per-token tensor ``[B, T, ...]`` -> this rank's ``[1, L, ...]``, aligned with the model's output."""
        x = self.packed.unpad(x)
        return x if self.shard is None else self.shard.shard(x, dim=1, pad_value=pad_value)

    def restore(self, x: torch.Tensor, pad_value: float = 0) -> torch.Tensor:
        """This rank's per-token output ``[1, L, ...]`` -> ``[B, T, ...]`` (gathered over sp; autograd)."""
        if self.shard is not None:
            x = self.shard.gather(x, dim=1)
        return self.packed.pad(x, pad_value)

    def layout(self) -> VarlenLayout:
        cu, seqlens = self.packed.cu_seqlens, list(self.packed.seqlens)
        group = None
        if self.shard is not None:
            group = self.shard.group
            if self.shard.pad_len:  # the sp padding is a segment of its own
                cu = torch.cat([cu, cu.new_tensor([self.shard.padded_total])])
                seqlens.append(self.shard.pad_len)
        return VarlenLayout(cu.to(self.input_ids.device), seqlens, max(seqlens, default=0), group)

    @contextmanager
    def attention(self):
        """Packed (and Ulysses) attention for models set up with ``use_varlen_attention``. Yields the layout: pass
        it to the model as ``npu_rl_varlen_layout=`` too, so that layers recomputed by gradient checkpointing (after
        this block) attend the same way."""
        with varlen_attention(self.layout()) as layout:
            yield layout


def prepare_packed_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          position_ids: torch.Tensor | None = None, *,
                          sp_group: dist.ProcessGroup | None = None) -> PackedInputs:
    """Pack ``[B, T]`` inputs, then (``sp_group`` of size > 1) pad and slice them for this sp rank. Ranks of one
    sp group must pass the same batch."""
    packed = unpad_input(input_ids, attention_mask, position_ids)
    if sp_group is None or dist.get_world_size(sp_group) == 1:
        return PackedInputs(packed, None, packed.input_ids, packed.position_ids)
    shard = SequenceShard(packed.total, sp_group)
    return PackedInputs(packed, shard, shard.shard(packed.input_ids), shard.shard(packed.position_ids))
