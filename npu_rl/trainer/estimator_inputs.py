"""Batch fields that some advantage estimators read beyond rewards, mask, groups and values (as they declare with
:func:`npu_rl.core.advantages.needs`).

- ``gdpo``: the reward components named by ``algorithm.gdpo_reward_keys`` (per-row extras of the reward manager: the
  entries of a ``compute_score`` that returns a dict) and ``algorithm.gdpo_reward_weights``.
- ``optimal_token_baseline`` / ``tir_optimal_token_baseline``: ``old_logprobs``, ``sum_pi_squared`` (from the actor)
  and ``rollout_is_weights`` when present.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from npu_rl.core import estimator_needs
from npu_rl.protocol import Batch


def estimator_extras(algorithm: Any, batch: Batch) -> dict[str, Any]:
    """Keyword arguments for :class:`npu_rl.core.AdvantageInputs` beyond the common ones."""
    extras: dict[str, Any] = {}
    wanted = estimator_needs(algorithm.adv_estimator)
    if "reward_components" in wanted and algorithm.gdpo_reward_keys:
        components = []
        for key in algorithm.gdpo_reward_keys:
            if key not in batch:
                raise KeyError(f"algorithm.gdpo_reward_keys names {key!r}, but the reward function returned no such "
                               f"field (it returned {sorted(batch.non_tensors)}); return a dict with {key!r} from "
                               "compute_score")
            values = np.asarray([np.nan if v is None else v for v in batch[key]], dtype=np.float64)
            if np.isnan(values).any():
                rows = np.flatnonzero(np.isnan(values))[:5].tolist()
                raise ValueError(f"reward component {key!r} is missing or NaN in rows {rows} of the batch")
            components.append(torch.from_numpy(values).float())
        extras["reward_components"] = tuple(components)
        if algorithm.gdpo_reward_weights is not None:
            extras["reward_weights"] = tuple(float(w) for w in algorithm.gdpo_reward_weights)
    if "sum_pi_squared" in wanted:
        for field in ("old_logprobs", "sum_pi_squared", "rollout_is_weights"):
            if field in batch:
                extras[field] = batch[field]
    return extras
