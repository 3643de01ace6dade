"""``Batch``: what flows between the controller and the workers.

A batch is a dict of tensors that share their first dimension (``input_ids`` [B, T], ``responses`` [B, R] ...), a
dict of per-row Python objects kept as NumPy object arrays (``data_source``, ``ground_truth``, ``uid`` ...), and a
``meta`` dict for values that belong to the whole batch (temperature, global token counts ...). It splits, indexes,
repeats and concatenates along the first dimension, which is all the dispatch decorators need, and it pickles, so
Ray can move it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch


def _as_object_array(values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == object:
        return values
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensors: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.non_tensors = {k: _as_object_array(v) for k, v in self.non_tensors.items()}
        self._check_lengths()

    # ------------------------------------------------------------------ basics
    def _check_lengths(self) -> None:
        lengths = {k: len(v) for k, v in self.tensors.items()} | {k: len(v) for k, v in self.non_tensors.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"Batch fields disagree on the batch size: {lengths}")

    def __len__(self) -> int:
        for value in self.tensors.values():
            return value.shape[0]
        for value in self.non_tensors.values():
            return len(value)
        return 0

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def __getitem__(self, key: str):
        if key in self.tensors:
            return self.tensors[key]
        if key in self.non_tensors:
            return self.non_tensors[key]
        raise KeyError(f"Batch has no field {key!r}; it has {sorted(self.tensors) + sorted(self.non_tensors)}")

    def __setitem__(self, key: str, value) -> None:
        if isinstance(value, torch.Tensor):
            self.non_tensors.pop(key, None)
            self.tensors[key] = value
        else:
            self.tensors.pop(key, None)
            self.non_tensors[key] = _as_object_array(value)
        if len(self) != len(value):
            raise ValueError(f"field {key!r} has {len(value)} rows, the batch has {len(self)}")

    def keys(self) -> list[str]:
        return list(self.tensors) + list(self.non_tensors)

    def get(self, key: str, default=None):
        return self[key] if key in self else default

    def pop(self, key: str):
        if key in self.tensors:
            return self.tensors.pop(key)
        return self.non_tensors.pop(key)

    # ------------------------------------------------------------------ reshaping
    def select(self, keys: Iterable[str], meta: bool = True) -> Batch:
        keys = list(keys)
        missing = [k for k in keys if k not in self]
        if missing:
            raise KeyError(f"Batch.select: missing fields {missing}; it has {self.keys()}")
        return Batch(
            {k: v for k, v in self.tensors.items() if k in keys},
            {k: v for k, v in self.non_tensors.items() if k in keys},
            dict(self.meta) if meta else {},
        )

    def index(self, idx: slice | Sequence[int] | torch.Tensor | np.ndarray) -> Batch:
        """Rows ``idx`` (a slice, integer indices or a boolean mask) as a new batch."""
        if isinstance(idx, slice):
            t_idx, n_idx = idx, idx
        else:
            t_idx = torch.as_tensor(np.asarray(idx)) if not isinstance(idx, torch.Tensor) else idx
            if t_idx.dtype == torch.bool:
                t_idx = t_idx.nonzero(as_tuple=True)[0]
            n_idx = t_idx.cpu().numpy()
        return Batch(
            {k: v[t_idx.to(v.device) if isinstance(t_idx, torch.Tensor) else t_idx] for k, v in self.tensors.items()},
            {k: v[n_idx] for k, v in self.non_tensors.items()},
            dict(self.meta),
        )

    def split(self, size: int) -> list[Batch]:
        """Consecutive pieces of ``size`` rows (the last may be shorter)."""
        if size <= 0:
            raise ValueError(f"split size must be positive, got {size}")
        return [self.index(slice(i, i + size)) for i in range(0, len(self), size)]

    def chunk(self, num_chunks: int) -> list[Batch]:
        """``num_chunks`` equal pieces; the batch size must divide."""
        if len(self) % num_chunks:
            raise ValueError(f"cannot chunk a batch of {len(self)} rows into {num_chunks} equal parts")
        return self.split(len(self) // num_chunks)

    def repeat(self, times: int, interleave: bool = True) -> Batch:
        """Each row ``times`` times: interleaved (a a b b) or tiled (a b a b)."""
        if interleave:
            tensors = {k: v.repeat_interleave(times, dim=0) for k, v in self.tensors.items()}
            non_tensors = {k: np.repeat(v, times, axis=0) for k, v in self.non_tensors.items()}
        else:
            tensors = {k: v.repeat(times, *([1] * (v.dim() - 1))) for k, v in self.tensors.items()}
            non_tensors = {k: np.tile(v, times) for k, v in self.non_tensors.items()}
        return Batch(tensors, non_tensors, dict(self.meta))

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Rows of all ``batches`` in order; fields must match; meta is taken from the first batch."""
        batches = [b for b in batches if b is not None]
        if not batches:
            return Batch()
        keys = set(batches[0].keys())
        for i, b in enumerate(batches[1:], 1):
            if set(b.keys()) != keys:
                raise ValueError(f"Batch.concat: batch {i} has fields {sorted(b.keys())}, batch 0 has {sorted(keys)}")
        tensors = {k: torch.cat([b.tensors[k] for b in batches]) for k in batches[0].tensors}
        non_tensors = {k: np.concatenate([b.non_tensors[k] for b in batches]) for k in batches[0].non_tensors}
        return Batch(tensors, non_tensors, dict(batches[0].meta))

    def union(self, other: Batch) -> Batch:
        """A new batch with this batch's fields and ``other``'s (``other`` wins on a clash); neither is changed."""
        return Batch(dict(self.tensors), dict(self.non_tensors), dict(self.meta)).update(other)

    def update(self, other: Batch) -> Batch:
        """Add (or replace) ``other``'s fields and meta; in place, returns self."""
        if len(self) and len(other) and len(self) != len(other):
            raise ValueError(f"Batch.update: sizes differ ({len(self)} vs {len(other)})")
        self.tensors.update(other.tensors)
        self.non_tensors.update(other.non_tensors)
        self.meta.update(other.meta)
        return self

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch({k: v.to(device, non_blocking=non_blocking) for k, v in self.tensors.items()},
                     dict(self.non_tensors), dict(self.meta))

    def __repr__(self) -> str:
        fields = [f"{k}{tuple(v.shape)}:{str(v.dtype).removeprefix('torch.')}" for k, v in self.tensors.items()]
        fields += [f"{k}[obj]" for k in self.non_tensors]
        return f"Batch(len={len(self)}, {', '.join(fields)}, meta={sorted(self.meta)})"


@dataclass
class WorkerOutput:
    """What a worker method returns when it has rows, metrics, or both: ``batch`` (None when it makes no rows) and
    ``metrics`` (floats). ``DP_SPLIT`` gathers the ranks' outputs into one: batches concatenated in data-parallel
    order, metrics reduced over the ranks (:func:`npu_rl.utils.metrics.reduce_over_ranks`: mean, or max for memory
    and timings)."""

    batch: Batch | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class DispatchLayout:
    """Where one rank sits for ``DP_SPLIT``: its data-parallel rank, the number of them, and whether its output is
    the one kept for its sequence-parallel group."""

    dp_rank: int
    dp_size: int
    is_collector: bool = True
