"""Balancing by token count: dynamic micro-batches under a token budget, and the batch across DP ranks.

- :func:`karmarkar_karp`: the largest differencing method for k-way partitioning of sequence lengths
  (https://en.wikipedia.org/wiki/Largest_differencing_method): repeatedly merge the two partial solutions with the
  largest spread, pairing one's heaviest set with the other's lightest. ``equal_size`` makes every part hold the
  same number of items (starting from k-item groups of consecutive sorted lengths keeps sizes equal).
- :func:`split_by_token_budget` (``use_dynamic_bsz``, ``*_max_token_len_per_gpu``): micro-batches whose valid
  tokens stay within the budget, balanced, the same number on every rank of ``dp_group`` (FSDP's collectives
  need every rank to run as many forwards). Returns the partitions so :func:`restore_order` can put per-row outputs
  back in the original order.
- :func:`balance_batch` (``trainer.balance_batch``): reorder the rows so that the contiguous pieces ``DP_SPLIT``
  hands to each data-parallel rank carry about the same number of tokens, with the ``global_seqlen/*`` metrics.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from npu_rl.device import get_backend
from npu_rl.parallel.dist import is_distributed
from npu_rl.protocol import Batch


def karmarkar_karp(values: Sequence[int], num_parts: int, equal_size: bool = False) -> list[list[int]]:
    """Indices of ``values`` in ``num_parts`` parts with sums as equal as the heuristic finds; each part's
    indices ascending. Parts may be empty when there are fewer values than parts (and ``equal_size`` is off)."""
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    if equal_size and len(values) % num_parts:
        raise ValueError(f"equal_size: {len(values)} items cannot form {num_parts} parts of equal size")
    order = sorted(range(len(values)), key=lambda i: (values[i], i))
    step = num_parts if equal_size else 1
    heap = []
    for tie, start in enumerate(range(0, len(order), step)):
        sets = [(values[i], [i]) for i in order[start:start + step]]
        sets += [(0, []) for _ in range(num_parts - len(sets))]
        heapq.heappush(heap, _state(sets, tie))
    tie = len(heap)
    while len(heap) > 1:
        a, b = heapq.heappop(heap)[-1], heapq.heappop(heap)[-1]
        merged = [(a[i][0] + b[-1 - i][0], a[i][1] + b[-1 - i][1]) for i in range(num_parts)]
        heapq.heappush(heap, _state(merged, tie))
        tie += 1
    final = heap[0][-1] if heap else [(0, [])] * num_parts
    return [sorted(items) for _, items in final]


def _state(sets: list[tuple[int, list[int]]], tie: int) -> tuple:
    """Heap entry: the largest spread pops first; sets kept heaviest first."""
    sets = sorted(sets, key=lambda s: s[0], reverse=True)
    return (-(sets[0][0] - sets[-1][0]), -sets[0][0], tie, sets)


def token_counts(batch: Batch, mask_key: str = "attention_mask") -> list[int]:
    """Valid tokens per row (one host sync)."""
    return batch[mask_key].sum(dim=-1).tolist()


def partition_by_token_budget(seqlens: Sequence[int], max_token_len: int, *, min_num_parts: int = 1,
                              sync_max: Callable[[int], int] | None = None) -> list[list[int]]:
    """Balanced parts of ``seqlens`` with every part's sum <= ``max_token_len``: the fewest parts that fit
    (at least ``min_num_parts``), agreed across ranks through ``sync_max`` (all-reduce MAX) when given."""
    if not seqlens:
        return []
    if max(seqlens) > max_token_len:
        raise ValueError(
            f"a sequence has {max(seqlens)} tokens, more than the token budget {max_token_len} "
            "(ppo_max_token_len_per_gpu / log_prob_max_token_len_per_gpu): raise it to at least "
            "max_prompt_length + max_response_length (divided by the sp size when sequence parallel)"
        )

    def fewest_from(k: int) -> tuple[int, list[list[int]]]:
        while True:  # k = len(seqlens) always fits, since each sequence fits
            parts = karmarkar_karp(seqlens, min(k, len(seqlens)))
            if max(sum(seqlens[i] for i in p) for p in parts) <= max_token_len:
                return k, parts
            k += 1

    k, parts = fewest_from(max(min_num_parts, math.ceil(sum(seqlens) / max_token_len)))
    if sync_max is not None:
        # Every rank sees the same all-reduced values, so all leave the loop together.
        k_max = sync_max(k)
        while True:
            if k_max > len(seqlens):
                raise ValueError(f"another rank needs {k_max} micro-batches but this rank has only {len(seqlens)} "
                                 "rows: give every data-parallel rank the same number of rows")
            k, parts = fewest_from(k_max)
            k_next = sync_max(k)
            if k_next == k_max:
                break
            k_max = k_next
    return sorted(parts, key=lambda p: p[0])


def _dp_sync_max(group: dist.ProcessGroup | None) -> Callable[[int], int]:
    def sync(value: int) -> int:
        t = torch.tensor([value], device=get_backend().device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return int(t.item())

    return sync


def split_by_token_budget(batch: Batch, max_token_len: int, *, dp_group: dist.ProcessGroup | None = None,
                          mask_key: str = "attention_mask",
                          min_num_micro_batches: int = 1) -> tuple[list[Batch], list[list[int]]]:
    """Micro-batches of ``batch`` within ``max_token_len`` valid tokens each, and their row indices. With
    ``dp_group`` (collective) every rank of the group gets the same number of micro-batches."""
    sync = _dp_sync_max(dp_group) if dp_group is not None and is_distributed() else None
    parts = partition_by_token_budget(token_counts(batch, mask_key), max_token_len,
                                      min_num_parts=min_num_micro_batches, sync_max=sync)
    return [batch.index(p) for p in parts], parts


def restore_order(outputs: Sequence[torch.Tensor | Batch], partitions: Sequence[Sequence[int]]):
    """Concatenate per-micro-batch outputs (tensors or batches, rows in partition order) back into the
    original row order."""
    order = torch.tensor([i for p in partitions for i in p], dtype=torch.long)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order))
    if all(isinstance(o, Batch) for o in outputs):
        return Batch.concat(list(outputs)).index(inverse)
    joined = torch.cat(list(outputs))
    return joined[inverse.to(joined.device)]


def balance_batch(batch: Batch, dp_size: int, *, mask_key: str = "attention_mask",
                  prefix: str = "global_seqlen") -> tuple[Batch, dict[str, int]]:
    """Reorder rows so that ``DP_SPLIT``'s ``dp_size`` contiguous pieces hold about equal token counts (equal row
    counts). Metrics: ``{prefix}/min|max|minmax_diff`` are the per-rank token sums of the pieces *before*
    balancing, ``{prefix}/balanced_min|balanced_max`` after."""
    seqlens = token_counts(batch, mask_key)
    if len(seqlens) % dp_size:
        raise ValueError(f"balance_batch: {len(seqlens)} rows cannot be split evenly over {dp_size} dp ranks")
    parts = karmarkar_karp(seqlens, dp_size, equal_size=True)
    rows = len(seqlens) // dp_size
    before = [sum(seqlens[i:i + rows]) for i in range(0, len(seqlens), rows)]
    after = [sum(seqlens[i] for i in p) for p in parts]
    metrics = {
        f"{prefix}/min": min(before),
        f"{prefix}/max": max(before),
        f"{prefix}/minmax_diff": max(before) - min(before),
        f"{prefix}/balanced_min": min(after),
        f"{prefix}/balanced_max": max(after),
    }
    return batch.index([i for p in parts for i in p]), metrics
