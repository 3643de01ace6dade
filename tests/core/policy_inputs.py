"""``PolicyLossInputs`` for tests: the settings are the schema's defaults (the one home of a default) unless a test
gives its own."""

from __future__ import annotations

from npu_rl.config.schema import PPOConfig
from npu_rl.core import PolicyLossInputs, resolved_clip_ratios


def schema_settings() -> dict:
    """The policy-loss settings of ``PolicyLossInputs`` at the schema's defaults, as the actor passes them."""
    actor = PPOConfig().actor_rollout_ref.actor
    pl = actor.policy_loss
    low, high = resolved_clip_ratios(actor.clip_ratio, actor.clip_ratio_low, actor.clip_ratio_high)
    return dict(loss_agg_mode=actor.loss_agg_mode, loss_scale_factor=actor.loss_scale_factor, clip_ratio_low=low,
                clip_ratio_high=high, clip_ratio_c=actor.clip_ratio_c, clip_cov_ratio=pl.clip_cov_ratio,
                clip_cov_lb=pl.clip_cov_lb, clip_cov_ub=pl.clip_cov_ub, kl_cov_ratio=pl.kl_cov_ratio,
                ppo_kl_coef=pl.ppo_kl_coef, tau_pos=actor.tau_pos, tau_neg=actor.tau_neg, dro_beta=pl.dro_beta,
                kl_loss_type=actor.kl_loss_type)


def policy_inputs(old_logprobs, logprobs, advantages, response_mask, **settings) -> PolicyLossInputs:
    return PolicyLossInputs(old_logprobs, logprobs, advantages, response_mask, **(schema_settings() | settings))
