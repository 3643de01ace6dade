"""``algorithm.rollout_correction``: from the config to the core's settings, its validation, and what it implies.

- :func:`correction_spec`: the core's :class:`~npu_rl.core.rollout_correction.RolloutCorrectionSpec` (plain values).
- :func:`check_rollout_correction`: problems, each naming its key (called by ``config.validate``).
- :func:`needs_rollout_logprobs` / :func:`enable_rollout_logprobs`: the correction (and bypass mode) need the
  engine's log-probs of the sampled tokens, so ``actor_rollout_ref.rollout.calculate_log_probs`` is turned on for
  them at load time (with the log-probs present the trainer also logs the ``rollout_corr/*`` mismatch metrics).
- :func:`policy_loss_mode`: ``bypass_mode`` replaces the policy loss when ``bypass_mode=true``.
"""

from __future__ import annotations

import logging
from typing import Any

from npu_rl.core.rollout_correction import RolloutCorrectionSpec

logger = logging.getLogger(__name__)
KEY = "algorithm.rollout_correction"
BYPASS_LOSS = "bypass_mode"


def correction_spec(rc: Any) -> RolloutCorrectionSpec:
    """The core's settings from ``algorithm.rollout_correction`` (raises ValueError naming the key suffix)."""
    return RolloutCorrectionSpec(
        rollout_is=rc.rollout_is, rollout_is_threshold=rc.rollout_is_threshold,
        rollout_is_batch_normalize=bool(rc.rollout_is_batch_normalize), rollout_rs=rc.rollout_rs,
        rollout_rs_threshold=rc.rollout_rs_threshold, loss_type=rc.loss_type)


def needs_rollout_logprobs(config: Any) -> bool:
    rc = config.algorithm.rollout_correction
    return rc.bypass_mode or rc.rollout_is is not None or rc.rollout_rs is not None


def enable_rollout_logprobs(config: Any) -> bool:
    """Turn ``rollout.calculate_log_probs`` on when the correction needs it; True when it changed."""
    rollout = config.actor_rollout_ref.rollout
    if needs_rollout_logprobs(config) and not rollout.calculate_log_probs:
        rollout.calculate_log_probs = True
        logger.info("%s needs the rollout's log-probs: actor_rollout_ref.rollout.calculate_log_probs=True", KEY)
        return True
    return False


def policy_loss_mode(config: Any) -> str:
    """The loss the actor runs: ``bypass_mode`` in bypass mode, else ``actor.policy_loss.loss_mode``."""
    if config.algorithm.rollout_correction.bypass_mode:
        return BYPASS_LOSS
    return config.actor_rollout_ref.actor.policy_loss.loss_mode


def check_rollout_correction(config: Any) -> list[str]:
    """Every problem with ``algorithm.rollout_correction`` and its neighbours, each naming the key."""
    rc = config.algorithm.rollout_correction
    loss_mode = config.actor_rollout_ref.actor.policy_loss.loss_mode
    problems = []
    try:
        correction_spec(rc)
    except ValueError as exc:
        problems.append(f"{KEY}.{exc}")
    if rc.rollout_rs is None and rc.rollout_rs_threshold is not None:
        problems.append(f"{KEY}.rollout_rs_threshold={rc.rollout_rs_threshold!r} is set but rollout_rs is null: "
                        "choose the rejection options (e.g. rollout_rs=token_k1) or leave the threshold null")
    if rc.rollout_is is None and rc.rollout_is_batch_normalize:
        problems.append(f"{KEY}.rollout_is_batch_normalize=true needs importance weights (rollout_is=token or "
                        "sequence)")
    if not rc.bypass_mode and rc.loss_type != "ppo_clip":
        problems.append(f"{KEY}.loss_type={rc.loss_type!r} only applies in bypass mode: set "
                        f"{KEY}.bypass_mode=true (or leave loss_type=ppo_clip)")
    if rc.bypass_mode and loss_mode not in ("vanilla", BYPASS_LOSS):
        problems.append(f"{KEY}.bypass_mode=true replaces the policy loss by 'bypass_mode' ({KEY}.loss_type="
                        f"{rc.loss_type}); actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r} would be "
                        "ignored: set it to vanilla, or turn bypass mode off")
    if not rc.bypass_mode and loss_mode == BYPASS_LOSS:
        problems.append(f"actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode needs {KEY}.bypass_mode=true "
                        "(the old log-probs must be the rollout's)")
    return problems
