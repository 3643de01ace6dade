"""Prompt batches across epochs, scoring, and DAPO's dynamic sampling (``algorithm.filter_groups``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from npu_rl.protocol import Batch


class PromptStream:
    """Endless prompt batches: at the end of an epoch the loader starts the next one (with that epoch's shuffle).

    Its state (the loader's epoch and position) goes into checkpoints: a run resumed at an epoch boundary continues
    into the next epoch instead of stopping (verl #7401 ran zero steps there).
    """

    def __init__(self, loader):
        self.loader = loader
        self._iter = None

    @property
    def batches_per_epoch(self) -> int:
        return len(self.loader)

    @property
    def epoch(self) -> int:
        return self.loader.epoch

    def next_batch(self) -> Batch:
        if self._iter is None:
            self._iter = iter(self.loader)
        try:
            return next(self._iter)
        except StopIteration:
            self._iter = iter(self.loader)  # the loader moved to the next epoch when the last one ended
            return next(self._iter)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)
        self._iter = None


def score_batch(batch: Batch, reward_fn) -> tuple[Batch, dict[str, Any]]:
    """``batch`` with ``token_level_scores`` [B, R] and the scorer's per-row extras (``acc``, ``pred`` ...) added
    (a new batch; the argument is not changed), and the reward metrics (``reward/errors`` ...)."""
    result = reward_fn(batch)
    scored = Batch({"token_level_scores": result.token_level_scores.float()}, dict(result.extra))
    return batch.union(scored), dict(result.metrics)


# algorithm.filter_groups.metric: a row's summed token scores, or the scorer's accuracy field
SUMMED_METRICS = ("seq_reward", "seq_final_reward", "score")
FILTER_METRICS = ("acc", *SUMMED_METRICS)


def _row_metric(batch: Batch, metric: str) -> np.ndarray:
    if metric in SUMMED_METRICS:
        return batch["token_level_scores"].sum(-1).numpy()
    if metric not in batch:
        raise KeyError(f"algorithm.filter_groups.metric={metric!r}: the reward function returned no {metric!r} field; "
                       f"it returned {sorted(batch.non_tensors)}")
    return np.asarray(batch[metric], dtype=np.float64)


def filter_groups(batch: Batch, metric: str) -> tuple[Batch, dict[str, torch.Tensor]]:
    """Keep the groups (rows sharing a ``uid``) whose ``metric`` is not constant; a group of one row is kept.

    ``seq_reward`` / ``seq_final_reward`` / ``score`` use the summed token-level scores (before any KL term).
    """
    values = _row_metric(batch, metric)
    uids = batch["uid"]
    keep_uid = {}
    for uid in dict.fromkeys(uids):
        group = values[uids == uid]
        keep_uid[uid] = len(group) == 1 or float(np.std(group)) > 0
    keep = np.array([keep_uid[u] for u in uids])
    num_groups = len(keep_uid)
    metrics = {"train/filter_groups_kept_ratio": torch.tensor(sum(keep_uid.values()) / max(num_groups, 1))}
    return batch.index(torch.as_tensor(keep)), metrics
