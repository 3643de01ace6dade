"""Dispatch modes: how a worker method's inputs are split over the ranks and its outputs gathered.

A worker method declares its mode once, with ``@register(Dispatch.DP_SPLIT)``; the driver then calls
``group.actor.update_policy(batch)`` as if it were a local function, whatever the backend (in-process or Ray).
The whole mechanism is :func:`split_inputs` (driver -> one ``(args, kwargs)`` per rank) and
:func:`collect_outputs` (one output per rank -> what the driver gets back).

Modes:

- ``ALL``: every rank gets the same arguments; the driver gets the list of every rank's output (rank order).
  Use it for collectives (model init, checkpoint save/load, weight sync) and for anything that must run everywhere.
- ``DP_SPLIT``: every :class:`~npu_rl.protocol.Batch` argument is cut into ``dp_size`` equal pieces along dim 0 and
  data-parallel rank ``d`` gets piece ``d``; other arguments go to every rank unchanged. Ranks of one
  sequence-parallel group share a ``dp_rank`` and so receive the same piece; only the group's *collector* output
  is kept. Kept outputs are concatenated in ``dp_rank`` order: ``Batch.concat`` for batches, ``torch.cat`` for
  tensors, one :class:`~npu_rl.protocol.WorkerOutput` for worker outputs (rows concatenated, metrics reduced over
  the ranks), ``None`` when all are ``None``, else a list.
- ``RANK0``: only rank 0 runs the method (no collectives allowed inside); the driver gets its output.

The data-parallel layout of a role comes from the worker's optional ``dispatch_layout()`` method
(:class:`DispatchLayout`; :meth:`npu_rl.parallel.ParallelMesh.dispatch_layout` builds it). Without that method
every rank is its own data-parallel rank.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from npu_rl.protocol import Batch, DispatchLayout, WorkerOutput
from npu_rl.utils.metrics import reduce_over_ranks

_ATTR = "__npu_rl_dispatch__"


class Dispatch(enum.Enum):
    ALL = "all"
    DP_SPLIT = "dp_split"
    RANK0 = "rank0"


@dataclass(frozen=True)
class DispatchSpec:
    mode: Dispatch
    blocking: bool = True
    pad_rows: bool = False


def register(mode: Dispatch = Dispatch.ALL, *, blocking: bool = True, pad_rows: bool = False) -> Callable:
    """Decorator for worker methods: ``@register(Dispatch.DP_SPLIT)``. ``blocking=False`` makes the group method
    return a :class:`~npu_rl.controller.worker_group.Pending` (call ``.get()``) so the driver can overlap roles.
    ``pad_rows=True`` (DP_SPLIT): a batch whose rows do not divide over the ranks is padded (:func:`pad_rows`) and
    the copies dropped from the output; for forwards whose rows are independent (a frozen teacher's or reward
    model's), which any row count (a teacher's share of the rows, a pool of any size) must reach."""
    if not isinstance(mode, Dispatch):
        raise TypeError(f"register() takes a Dispatch mode, got {mode!r}; known: {[m.name for m in Dispatch]}")

    def decorate(fn: Callable) -> Callable:
        setattr(fn, _ATTR, DispatchSpec(mode, blocking, pad_rows))
        return fn

    return decorate


def dispatch_spec(cls: type, name: str) -> DispatchSpec | None:
    """The spec ``name`` was registered with on ``cls`` (or a base class), or None."""
    return getattr(getattr(cls, name, None), _ATTR, None)


def registered_methods(cls: type) -> dict[str, DispatchSpec]:
    return {name: spec for name in dir(cls) if (spec := dispatch_spec(cls, name)) is not None}


def check_layouts(layouts: Sequence[DispatchLayout]) -> int:
    """Validate a role's layouts (one per rank); return dp_size."""
    dp_size = layouts[0].dp_size
    if any(lay.dp_size != dp_size for lay in layouts):
        raise ValueError(f"ranks disagree on dp_size: {[lay.dp_size for lay in layouts]}")
    collectors = sorted(lay.dp_rank for lay in layouts if lay.is_collector)
    if collectors != list(range(dp_size)):
        raise ValueError(f"each dp_rank in 0..{dp_size - 1} needs exactly one collector rank; got {collectors}")
    return dp_size


def _chunk(value: Any, dp_size: int, method: str) -> Any:
    if isinstance(value, Batch):
        if len(value) % dp_size:
            raise ValueError(
                f"{method}: a batch of {len(value)} rows cannot be split evenly over {dp_size} data-parallel ranks; "
                "make the batch size (train_batch_size x rollout.n, mini-batch sizes) a multiple of the dp size"
            )
        return value.chunk(dp_size)
    return None  # not split: every rank gets it as is


def split_inputs(mode: Dispatch, world_size: int, layouts: Sequence[DispatchLayout] | None,
                 args: tuple, kwargs: dict, method: str = "method") -> list[tuple[tuple, dict] | None]:
    """One ``(args, kwargs)`` per rank; ``None`` for a rank that does not run the call."""
    if mode is Dispatch.ALL:
        return [(args, kwargs)] * world_size
    if mode is Dispatch.RANK0:
        return [(args, kwargs)] + [None] * (world_size - 1)
    dp_size = check_layouts(layouts)
    split_args = [_chunk(a, dp_size, method) for a in args]
    split_kwargs = {k: _chunk(v, dp_size, method) for k, v in kwargs.items()}
    per_rank = []
    for lay in layouts:
        rank_args = tuple(a if s is None else s[lay.dp_rank] for a, s in zip(args, split_args))
        rank_kwargs = {k: v if split_kwargs[k] is None else split_kwargs[k][lay.dp_rank] for k, v in kwargs.items()}
        per_rank.append((rank_args, rank_kwargs))
    return per_rank


def pad_rows(args: tuple, kwargs: dict, dp_size: int) -> tuple[tuple, dict, int | None]:
    """The :class:`Batch` arguments grown to a multiple of ``dp_size`` rows by repeating their last row, and the
    row count before (None when nothing needed it). For frozen roles only (a teacher's or a reward model's forward:
    each row's output depends on that row alone, so the copies are dropped by :func:`trim_rows` unread); a training
    step would count the copies."""
    sizes = {len(v) for v in (*args, *kwargs.values()) if isinstance(v, Batch)}
    if not sizes or all(n % dp_size == 0 for n in sizes):
        return args, kwargs, None
    if len(sizes) > 1:
        raise ValueError(f"batches of different lengths {sorted(sizes)} in one call cannot be padded alike")
    rows = sizes.pop()
    if rows == 0:
        return args, kwargs, None
    index = list(range(rows)) + [rows - 1] * (-rows % dp_size)

    def grow(value: Any) -> Any:
        return value.index(index) if isinstance(value, Batch) else value

    return tuple(grow(a) for a in args), {k: grow(v) for k, v in kwargs.items()}, rows


def trim_rows(output: Any, rows: int | None) -> Any:
    """The first ``rows`` rows of a DP_SPLIT call's gathered output (what :func:`pad_rows` added, dropped)."""
    if rows is None or output is None:
        return output
    if isinstance(output, Batch):
        return output.index(slice(0, rows))
    if isinstance(output, torch.Tensor):
        return output[:rows]
    if isinstance(output, WorkerOutput):
        return WorkerOutput(trim_rows(output.batch, rows), output.metrics)
    raise TypeError(f"cannot drop padded rows from a {type(output).__name__}")


def _concat(outputs: list) -> Any:
    if all(o is None for o in outputs):
        return None
    if all(isinstance(o, Batch) for o in outputs):
        return Batch.concat(outputs)
    if all(isinstance(o, WorkerOutput) for o in outputs):
        batches = [o.batch for o in outputs if o.batch is not None]
        return WorkerOutput(Batch.concat(batches) if batches else None, reduce_over_ranks([o.metrics for o in outputs]))
    if all(isinstance(o, torch.Tensor) for o in outputs):
        return torch.cat(outputs)
    return outputs


def collect_outputs(mode: Dispatch, layouts: Sequence[DispatchLayout] | None, outputs: list) -> Any:
    """What the driver gets back from the per-rank outputs (``None`` for ranks that did not run)."""
    if mode is Dispatch.ALL:
        return list(outputs)
    if mode is Dispatch.RANK0:
        return outputs[0]
    kept = sorted((lay.dp_rank, i) for i, lay in enumerate(layouts) if lay.is_collector)
    return _concat([outputs[i] for _, i in kept])
