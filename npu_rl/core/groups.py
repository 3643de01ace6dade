"""Group ids and per-group statistics for the group-baseline advantage estimators (GRPO, RLOO, OPO ...).

Group ids (one per sample: the samples drawn for the same prompt share one) arrive as an integer tensor, a numpy
array or a list; integers, strings and uuid strings are all accepted and mapped to contiguous ids ``0..G-1``.

Statistics are computed with ``index_add_`` into buffers of size ``B`` (there are never more groups than samples),
so no host value (``G``) is needed. The group std is the UNBIASED one (Bessel's correction, ``torch.std``'s
default), as verl computes it, so that verl configs reproduce verl's advantages; torchtitan uses the population
std. A group of one sample has mean 0 and std 1 (verl's convention): its advantage is its raw score, never NaN.
A group whose scores are all equal has exactly that mean and std 0, so its advantages are exactly 0 (verl's
``sum / n`` leaves rounding noise there that the division by ``std + eps`` blows up).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch


def as_group_ids(index: Any, *, num_samples: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Map group labels to contiguous int64 ids ``0..G-1`` [B] on ``device``.

    Accepts an integer tensor, a numpy array (ints, strings, objects) or a list. Labels keep their sort order.
    """
    if index is None:
        raise ValueError("this advantage estimator needs group ids (AdvantageInputs.index, e.g. the batch's 'uid')")
    if isinstance(index, torch.Tensor):
        if index.dtype.is_floating_point or index.dtype.is_complex:
            raise TypeError(f"group ids must be integers or strings, got a {index.dtype} tensor")
        ids = torch.unique(index.reshape(-1), return_inverse=True)[1]
    else:
        array = np.asarray(index)
        if array.dtype.kind == "f":
            raise TypeError(f"group ids must be integers or strings, got a numpy {array.dtype} array")
        if array.dtype.kind == "O":  # mixed python objects: compare them as strings
            array = np.array([str(label) for label in array.reshape(-1)])
        ids = torch.from_numpy(np.unique(array.reshape(-1), return_inverse=True)[1].astype(np.int64))
    if ids.numel() != num_samples:
        raise ValueError(f"got {ids.numel()} group ids for a batch of {num_samples} samples")
    return ids.to(device=device if device is not None else ids.device, dtype=torch.long)


class GroupStats(NamedTuple):
    """Per-group statistics indexed by group id; each is [B] (entries past the last group are unused)."""

    count: torch.Tensor  # [B] samples per group
    mean: torch.Tensor  # [B] 0 for groups of one sample; exactly the common value for a constant group
    std: torch.Tensor  # [B] unbiased; 1 for groups of one sample; exactly 0 for a constant group
    constant: torch.Tensor  # [B] bool: the group has more than one sample, all with the same score


def group_sum(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` [B] per group -> [B] indexed by group id."""
    return torch.zeros_like(values).index_add_(0, group_ids, values)


def group_stats(scores: torch.Tensor, group_ids: torch.Tensor) -> GroupStats:
    """Count, mean and unbiased std of ``scores`` [B] per group.

    A group whose scores are all equal gets that value as its mean exactly: ``sum / n`` can be off by an ulp
    (16 x 0.7 in float32), and divided by ``std + 1e-6`` that rounding would become an advantage of ~0.1.
    """
    count = group_sum(torch.ones_like(scores), group_ids)
    highest = torch.full_like(scores, float("-inf")).scatter_reduce(0, group_ids, scores, reduce="amax")
    lowest = torch.full_like(scores, float("inf")).scatter_reduce(0, group_ids, scores, reduce="amin")
    constant = (highest == lowest) & (count > 1)
    mean = group_sum(scores, group_ids) / count.clamp(min=1)
    mean = torch.where(constant, highest, mean)
    centered = scores - mean[group_ids]
    std = (group_sum(centered * centered, group_ids) / (count - 1).clamp(min=1)).sqrt()
    single = count <= 1
    return GroupStats(
        count=count,
        mean=torch.where(single, torch.zeros_like(mean), mean),
        std=torch.where(single, torch.ones_like(std), std),
        constant=constant,
    )
