"""The RL math, as pure tensor functions: advantage estimators, policy losses, value loss, entropy bonus, KL
estimators and controllers, loss aggregation, and the rollout correction (importance weights, rejection and the
mismatch metrics between the rollout engine's log-probs and the trainer's).

No config objects, no device names, no ``torch.distributed``, no ``.item()``: the workers pass plain numbers and
tensors in (including the global denominators of :mod:`npu_rl.core.aggregation`) and log the metric tensors.

Extension points, one registry and one signature each (a user's function plugs in by ``pkg.mod:fn`` or
``path/file.py:fn`` as the name):

- ``ADV_ESTIMATORS`` (``algorithm.adv_estimator``): ``fn(inputs: AdvantageInputs) -> AdvantageOutput``; an
  estimator declares the optional inputs it reads with ``@needs("values")`` (read by ``estimator_needs``)
- ``POLICY_LOSSES`` (``actor_rollout_ref.actor.policy_loss.loss_mode``): ``fn(inputs: PolicyLossInputs) -> LossOutput``;
  a fused kernel registers as another implementation of a loss (``register_implementation``), not a new loss
- ``KL_ESTIMATORS`` (``algorithm.kl_penalty``, ``actor.kl_loss_type``): ``fn(*, logprobs, ref_logprobs) -> [B, T]``

Config validation calls ``ADV_ESTIMATORS.check(name)``, ``POLICY_LOSSES.check(name)``, ``check_kl_type(name)`` and
``check_loss_agg_mode(name)`` / ``LOSS_AGG_MODES``.
"""

from npu_rl.core.advantages import (
    ADV_ESTIMATORS,
    AdvantageInputs,
    AdvantageOutput,
    compute_advantages,
    estimator_needs,
    needs,
)
from npu_rl.core.aggregation import (
    LOSS_AGG_MODES,
    LossOutput,
    agg_loss,
    check_loss_agg_mode,
    loss_denominators,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from npu_rl.core.groups import as_group_ids, group_stats
from npu_rl.core.kl import (
    KL_CONTROLLER_TYPES,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    check_kl_type,
    kl_in_reward,
    kl_loss,
    kl_penalty,
    make_kl_controller,
)
from npu_rl.core.policy_loss import POLICY_LOSSES, PolicyLossInputs, compute_policy_loss, resolved_clip_ratios
from npu_rl.core.rollout_correction import CorrectionOutput, RolloutCorrectionSpec, rollout_correction
from npu_rl.core.value_loss import entropy_bonus, entropy_from_logits, value_loss

__all__ = [
    "ADV_ESTIMATORS",
    "KL_CONTROLLER_TYPES",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageInputs",
    "AdvantageOutput",
    "CorrectionOutput",
    "FixedKLController",
    "KLController",
    "LossOutput",
    "PolicyLossInputs",
    "RolloutCorrectionSpec",
    "agg_loss",
    "as_group_ids",
    "check_kl_type",
    "check_loss_agg_mode",
    "compute_advantages",
    "compute_policy_loss",
    "entropy_bonus",
    "entropy_from_logits",
    "estimator_needs",
    "group_stats",
    "kl_in_reward",
    "kl_loss",
    "kl_penalty",
    "loss_denominators",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "needs",
    "resolved_clip_ratios",
    "rollout_correction",
    "value_loss",
]
