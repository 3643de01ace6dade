"""``algorithm.rollout_correction``: what the keys imply for the run, and the rules between them and their neighbours.

- :func:`needs_rollout_logprobs`: the correction (and bypass mode) need the engine's log-probs of the sampled tokens
  (``RunSettings.rollout_logprobs`` is then true, whatever ``actor_rollout_ref.rollout.calculate_log_probs`` says).
- :func:`policy_loss_mode`: ``bypass_mode`` replaces the policy loss when ``bypass_mode=true``.
- :func:`rollout_correction_problems`: the rules between the keys, each problem naming its key. The values
  themselves (threshold syntax, option names) are checked where they are parsed, by the core's
  ``RolloutCorrectionSpec`` (``npu_rl.trainer.checks``).
"""

from __future__ import annotations

from typing import Any

KEY = "algorithm.rollout_correction"
BYPASS_LOSS = "bypass_mode"


def needs_rollout_logprobs(config: Any) -> bool:
    rc = config.algorithm.rollout_correction
    return rc.bypass_mode or rc.rollout_is is not None or rc.rollout_rs is not None


def policy_loss_mode(config: Any) -> str:
    """The loss the actor runs: ``bypass_mode`` in bypass mode, else ``actor.policy_loss.loss_mode``."""
    if config.algorithm.rollout_correction.bypass_mode:
        return BYPASS_LOSS
    return config.actor_rollout_ref.actor.policy_loss.loss_mode


def rollout_correction_problems(config: Any) -> list[str]:
    """Every problem between ``algorithm.rollout_correction``'s keys and their neighbours, each naming the key."""
    rc = config.algorithm.rollout_correction
    loss_mode = config.actor_rollout_ref.actor.policy_loss.loss_mode
    problems = []
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
