"""The trainer's side of ``algorithm.rollout_correction`` (the math is :mod:`npu_rl.core.rollout_correction`).

Decoupled mode (``bypass_mode=false``, three policies: rollout, old, current): after the old log-probs,
:func:`correct_batch` computes the weights on the whole batch (so ``rollout_is_batch_normalize`` is a batch mean),
adds ``rollout_is_weights`` for the policy loss, removes rejected tokens from ``response_mask`` and returns the
``rollout_corr/*`` metrics. With the rollout's log-probs present and no correction asked it still returns the
metrics (the off-policy gap).

Bypass mode (two policies): :func:`bypass_old_logprobs` takes the rollout's log-probs as the old ones (no
recomputation); the ``bypass_mode`` policy loss weights / rejects per micro-batch and reports the metrics.
"""

from __future__ import annotations

from typing import Any

import torch

from npu_rl.config.rollout_correction import KEY
from npu_rl.core.rollout_correction import RolloutCorrectionSpec, rollout_correction
from npu_rl.protocol import Batch

PREFIX = "rollout_corr/"


def correction_spec(rc: Any) -> RolloutCorrectionSpec:
    """The core's settings from ``algorithm.rollout_correction`` (raises ValueError naming the key suffix)."""
    return RolloutCorrectionSpec(
        rollout_is=rc.rollout_is, rollout_is_threshold=rc.rollout_is_threshold,
        rollout_is_batch_normalize=bool(rc.rollout_is_batch_normalize), rollout_rs=rc.rollout_rs,
        rollout_rs_threshold=rc.rollout_rs_threshold, loss_type=rc.loss_type)


def correct_batch(batch: Batch, config: Any) -> tuple[Batch, dict[str, torch.Tensor]]:
    """(a batch with ``rollout_is_weights`` / the filtered ``response_mask`` where asked, ``rollout_corr/*``);
    ``batch`` itself is left as it was. Without ``rollout_logprobs`` in the batch: (batch, {})."""
    if "rollout_logprobs" not in batch:
        if correction_spec(config.algorithm.rollout_correction).enabled:
            raise RuntimeError(f"{KEY} is on but the rollout returned no log-probs (rollout_logprobs); "
                               "actor_rollout_ref.rollout.calculate_log_probs must be true")
        return batch, {}
    spec = correction_spec(config.algorithm.rollout_correction)
    out = rollout_correction(batch["old_logprobs"].float(), batch["rollout_logprobs"].float(),
                             batch["response_mask"], spec)
    corrected = batch.select(batch.keys())
    if out.weights is not None:
        corrected["rollout_is_weights"] = out.weights
    if spec.rollout_rs is not None:
        corrected["response_mask"] = out.response_mask
    return corrected, {PREFIX + k: v for k, v in out.metrics.items()}


def bypass_old_logprobs(batch: Batch) -> Batch:
    """A batch whose ``old_logprobs`` are the rollout's (bypass mode: the old-log-prob forward is skipped)."""
    if "rollout_logprobs" not in batch:
        raise RuntimeError(f"{KEY}.bypass_mode=true needs the rollout's log-probs, and the rollout returned none: "
                           "actor_rollout_ref.rollout.calculate_log_probs must be true")
    out = batch.select(batch.keys())
    out["old_logprobs"] = batch["rollout_logprobs"]
    return out
