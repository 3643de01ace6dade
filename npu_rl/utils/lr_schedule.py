"""Learning-rate schedules with linear warm-up (verl's ``lr_scheduler_type`` / ``warmup_style``: constant, cosine)."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

SCHEDULES = ("constant", "cosine")  # optim.lr_scheduler_type (or verl's older warmup_style)


def warmup_steps(lr_warmup_steps: int, lr_warmup_steps_ratio: float, total_steps: int) -> int:
    """``lr_warmup_steps`` when > 0, else ``ratio x total``."""
    if lr_warmup_steps > 0:
        return lr_warmup_steps
    return int(lr_warmup_steps_ratio * max(total_steps, 0))


def lr_factor(step: int, kind: str, num_warmup: int, total_steps: int, min_lr_ratio: float = 0.0,
              num_cycles: float = 0.5) -> float:
    """Multiplier of the base lr after ``step`` optimizer steps."""
    if num_warmup > 0 and step < num_warmup:
        return (step + 1) / num_warmup  # reaches 1.0 at the end of warm-up, never 0 at step 0
    if kind == "constant":
        return 1.0
    if kind == "cosine":
        progress = (step - num_warmup) / max(1, total_steps - num_warmup)
        cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * num_cycles * min(progress, 1.0)))
        return min_lr_ratio + (1.0 - min_lr_ratio) * cosine
    raise ValueError(f"unknown lr schedule {kind!r}; expected one of {', '.join(SCHEDULES)}")


def build_scheduler(optimizer: Optimizer, optim_config, total_steps: int) -> LambdaLR:
    kind = optim_config.warmup_style or optim_config.lr_scheduler_type
    num_warmup = warmup_steps(optim_config.lr_warmup_steps, optim_config.lr_warmup_steps_ratio, total_steps)
    return LambdaLR(optimizer, lambda step: lr_factor(step, kind, num_warmup, total_steps,
                                                      optim_config.min_lr_ratio, optim_config.num_cycles))
