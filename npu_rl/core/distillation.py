"""On-policy distillation: the student's loss against a frozen teacher's log-probs on the student's own samples.

verl's ``distillation.distillation_loss.*`` (verl/trainer/distillation/losses.py at 1dda039). For a response
sampled from the student pi, with ``s_t`` the student's log-prob of token ``y_t`` and ``q_t`` the teacher's::

    d_t = estimator(s_t, q_t)      loss_mode: kl / k1 = s - q, abs = |s - q|, mse / k2 = (s - q)^2 / 2,
                                   low_var_kl / k3 = exp(q - s) - (q - s) - 1 (verl's clamps, npu_rl.core.kl)
    d_t <- clamp(d_t, -c, c)       loss_max_clamp = c (None: no clamp); the metrics are read before the clamp

Each is a single-sample estimator of the reverse KL, KL(pi(.|s_t) || teacher(.|s_t)), since y_t ~ pi. Then

    use_policy_gradient=False:  L_distill = agg(d)                                  (GKD-style, backpropagated)
    use_policy_gradient=True:   L_distill = vanilla PPO loss with A_t = -sg(d_t)    (the negative KL as a reward;
                                clip_ratio_low / clip_ratio_high of distillation_loss, dual-clip bound 3.0 as in verl)
    use_task_rewards=True:      L = L_policy + distillation_loss_coef * L_distill   (L_policy: the actor's whole loss)
    use_task_rewards=False:     L = L_distill                                       (the policy's loss is dropped)

``agg`` is the actor's ``loss_agg_mode`` with the mini-batch's global denominators. ``k1`` backpropagated directly has
no gradient through the teacher, so it needs ``use_policy_gradient=True`` (verl refuses it the same way).

The top-k forward KL of verl (``forward_kl_topk``: the teacher's top-k log-probs against the student's full
distribution) is not implemented: it needs the teacher's top-k ids and the student's logits inside the forward.

Metrics (the actor prefixes ``actor/``): ``distillation/abs_loss`` (mean |d| over valid tokens), ``distillation/
loss_min`` / ``loss_max`` (over valid tokens, before the clamp), and with the policy gradient
``distillation/{pg_clipfrac,ppo_kl,pg_clipfrac_lower}``; the caller logs ``distillation/loss`` (L_distill).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from npu_rl.core.aggregation import LossOutput, masked_mean
from npu_rl.core.kl import kl_penalty
from npu_rl.core.policy_loss import PolicyLossInputs, compute_policy_loss

ESTIMATOR_LOSS_MODES: tuple[str, ...] = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
TOPK_LOSS_MODES: tuple[str, ...] = ("forward_kl_topk",)  # verl's; not implemented here (module docstring)
PG_DUAL_CLIP = 3.0  # verl's vanilla loss reads clip_ratio_c from a config that has none here: its default 3.0


@dataclass(frozen=True)
class DistillationSpec:
    """The settings of ``distillation.distillation_loss`` the loss reads (no defaults: the schema has them)."""

    loss_mode: str
    use_task_rewards: bool
    distillation_loss_coef: float
    loss_max_clamp: float | None
    use_policy_gradient: bool
    clip_ratio_low: float
    clip_ratio_high: float


def distillation_problems(loss_mode: str, use_policy_gradient: bool, policy_loss_mode: str, key: str) -> list[str]:
    """What is wrong with these settings (empty: nothing); ``key`` names ``distillation.distillation_loss``."""
    if loss_mode in TOPK_LOSS_MODES:
        return [f"{key}.loss_mode={loss_mode}: the top-k forward KL is not implemented in npu-rl (it needs the "
                "teacher's top-k token ids and the student's logits in the forward); use one of the reverse-KL "
                f"estimators {', '.join(ESTIMATOR_LOSS_MODES)} (verl's scripts use k1 with use_policy_gradient=True)"]
    if loss_mode not in ESTIMATOR_LOSS_MODES:
        return [f"{key}.loss_mode={loss_mode!r} is not a distillation loss; expected one of "
                f"{', '.join(ESTIMATOR_LOSS_MODES + TOPK_LOSS_MODES)}"]
    problems = []
    if not use_policy_gradient and loss_mode in ("kl", "k1"):
        problems.append(f"{key}.loss_mode={loss_mode} with use_policy_gradient=False: the gradient of k1 does not "
                        "depend on the teacher's log-probs; set use_policy_gradient=True or loss_mode=k3")
    if use_policy_gradient and policy_loss_mode != "vanilla":
        problems.append(f"{key}.policy_loss_mode={policy_loss_mode!r}: only 'vanilla' is supported (as in verl)")
    return problems


def distillation_token_losses(*, student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                              loss_mode: str) -> torch.Tensor:
    """``d`` [B, T]: the estimator ``loss_mode`` of KL(student || teacher) at the sampled tokens."""
    return kl_penalty(logprobs=student_logprobs, ref_logprobs=teacher_logprobs, kl_type=loss_mode)


def _extreme(values: torch.Tensor, valid: torch.Tensor, largest: bool) -> torch.Tensor:
    fill = torch.finfo(values.dtype).min if largest else torch.finfo(values.dtype).max
    picked = torch.where(valid, values, torch.full_like(values, fill))
    out = picked.max() if largest else picked.min()
    return torch.where(valid.any(), out, torch.zeros_like(out))


def distillation_loss(*, inputs: PolicyLossInputs, teacher_logprobs: torch.Tensor, spec: DistillationSpec
                      ) -> LossOutput:
    """``L_distill`` of one micro-batch and its metrics. ``inputs``: the actor's policy-loss inputs (the student's
    ``logprobs`` with gradient, ``old_logprobs``, mask, aggregation and denominators); only their clip ratios are
    replaced by the distillation's in the policy-gradient form."""
    losses = distillation_token_losses(student_logprobs=inputs.logprobs, teacher_logprobs=teacher_logprobs,
                                       loss_mode=spec.loss_mode)
    valid = inputs.response_mask.bool()
    detached = losses.detach()
    metrics = {"distillation/abs_loss": masked_mean(detached.abs(), valid),
               "distillation/loss_min": _extreme(detached, valid, largest=False),
               "distillation/loss_max": _extreme(detached, valid, largest=True)}
    if spec.loss_max_clamp is not None:
        losses = losses.clamp(min=-spec.loss_max_clamp, max=spec.loss_max_clamp)
    if not spec.use_policy_gradient:
        return LossOutput(inputs.aggregate(losses), metrics)
    pg_inputs = replace(inputs, advantages=-losses.detach(), clip_ratio_low=spec.clip_ratio_low,
                        clip_ratio_high=spec.clip_ratio_high, clip_ratio_c=PG_DUAL_CLIP)
    pg = compute_policy_loss(loss_mode="vanilla", inputs=pg_inputs)
    metrics |= {f"distillation/{k}": pg.metrics[k] for k in ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower")}
    return LossOutput(pg.loss, metrics)


def combined_loss(policy_loss: torch.Tensor | float, distill_loss: torch.Tensor, spec: DistillationSpec
                  ) -> torch.Tensor:
    """The actor's loss with distillation: ``L_policy + coef * L_distill``, or ``L_distill`` alone without task
    rewards (module docstring)."""
    if not spec.use_task_rewards:
        return distill_loss
    return policy_loss + spec.distillation_loss_coef * distill_loss
