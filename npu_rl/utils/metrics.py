"""Reducing metric values: over micro-batches and mini-batches (a worker's update) and over ranks (the driver)."""

from __future__ import annotations

from typing import Mapping, Sequence

import torch


def mean_of(metric_dicts: Sequence[Mapping[str, torch.Tensor | float]]) -> dict[str, torch.Tensor]:
    """Average per-micro-batch metric tensors key by key (keys absent from a dict are averaged over the rest)."""
    out: dict[str, list[torch.Tensor]] = {}
    for d in metric_dicts:
        for k, v in d.items():
            out.setdefault(k, []).append(v.detach().float().reshape(()) if isinstance(v, torch.Tensor)
                                         else torch.tensor(float(v)))
    return {k: torch.stack(v).mean() for k, v in out.items()}


def reduces_by_max(key: str) -> bool:
    """Memory figures and phase timings are reduced over ranks by their maximum (the largest rank is the one that
    runs out of memory, the slowest the one the step waits for); everything else by the mean."""
    return key.startswith("timing_s/") or "memory" in key or key.endswith("_gb")


def reduce_over_ranks(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One metrics dict per data-parallel rank -> one dict (mean, or max per :func:`reduces_by_max`)."""
    if not per_rank:
        return {}
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for d in per_rank for k in d):
        values = [float(d[key]) for d in per_rank if key in d]
        out[key] = max(values) if reduces_by_max(key) else sum(values) / len(values)
    return out
