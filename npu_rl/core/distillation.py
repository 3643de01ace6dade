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

The top-k forward KL (``loss_mode=forward_kl_topk``; verl/trainer/distillation/fsdp/losses.py): with the teacher's
top-k ids ``V_t`` (``topk`` = K) at each position, its log-probs ``q_t(v)`` there and the student's ``s_t(v)`` at the
same ids (from its full distribution at the rollout temperature, with gradient)::

    q, s       <- clamp_min(q, m), clamp_min(s, m)     log_prob_min_clamp = m (None: no clamp)
    d_t         = sum_{v in V_t} exp(q_t(v)) (q_t(v) - s_t(v)),  then  d_t <- max(d_t, 0)

(the top-k masses do not sum to 1, so the truncated KL can go negative; verl clamps it at 0, before the range metrics
and ``loss_max_clamp``). Metrics: ``distillation/{student,teacher}_mass`` (the top-k mass, mean / ``_min`` / ``_max``
over valid tokens), ``distillation/overlap_ratio`` (shared ids of the two top-k's over K) and
``distillation/overlap_token_advantage`` (mean over positions with shared ids of ``-sum_{shared} exp(q)(q - s)`` over
the shared count).

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
TOPK_LOSS_MODES: tuple[str, ...] = ("forward_kl_topk",)  # the teacher's top-k against the student (docstring)
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
    topk: int = 0  # K of forward_kl_topk (0 for the estimators)
    log_prob_min_clamp: float | None = None  # forward_kl_topk's clamp of both top-k log-probs

    @property
    def uses_topk(self) -> bool:
        return self.loss_mode in TOPK_LOSS_MODES


def distillation_problems(loss_mode: str, use_policy_gradient: bool, policy_loss_mode: str, key: str,
                          topk: int | None = None) -> list[str]:
    """What is wrong with these settings (empty: nothing); ``key`` names ``distillation.distillation_loss``."""
    if loss_mode not in ESTIMATOR_LOSS_MODES + TOPK_LOSS_MODES:
        return [f"{key}.loss_mode={loss_mode!r} is not a distillation loss; expected one of "
                f"{', '.join(ESTIMATOR_LOSS_MODES + TOPK_LOSS_MODES)}"]
    problems = []
    if loss_mode in TOPK_LOSS_MODES and (topk is None or int(topk) < 1):
        problems.append(f"{key}.topk={topk}: loss_mode={loss_mode} needs the number of the teacher's top tokens "
                        "per position (>= 1; verl's default 32)")
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


def forward_kl_topk(*, student_topk_logprobs: torch.Tensor, teacher_topk_logprobs: torch.Tensor,
                    student_topk_ids: torch.Tensor, teacher_topk_ids: torch.Tensor,
                    log_prob_min_clamp: float | None) -> dict[str, torch.Tensor]:
    """The truncated forward KL per token (module docstring; verl's ``compute_forward_kl_topk``): inputs [B, T, K]
    (the student's log-probs at the teacher's ids, the teacher's top-k log-probs, both top-k id sets); returns
    ``distillation_losses`` (before verl's clamp at 0), ``student_mass``, ``teacher_mass``, ``overlap_count`` and
    ``overlap_token_advantage``, each [B, T]."""
    student_mass = student_topk_logprobs.exp().sum(dim=-1)
    teacher_mass = teacher_topk_logprobs.exp().sum(dim=-1)
    s, q = student_topk_logprobs, teacher_topk_logprobs
    if log_prob_min_clamp is not None:
        s, q = s.clamp_min(log_prob_min_clamp), q.clamp_min(log_prob_min_clamp)
    s, q = s.float(), q.float()
    token_kl = q.exp() * (q - s)
    losses = token_kl.sum(dim=-1)
    overlap = (teacher_topk_ids.unsqueeze(-1) == student_topk_ids.unsqueeze(-2)).any(dim=-1)
    count = overlap.sum(dim=-1)
    advantage = (-token_kl * overlap).sum(dim=-1) / count.clamp_min(1)
    advantage = torch.where(count > 0, advantage, torch.zeros_like(advantage))
    return {"distillation_losses": losses, "student_mass": student_mass, "teacher_mass": teacher_mass,
            "overlap_count": count, "overlap_token_advantage": advantage}


def topk_token_losses(*, student_topk_logprobs: torch.Tensor, teacher_topk_logprobs: torch.Tensor,
                      student_topk_ids: torch.Tensor, teacher_topk_ids: torch.Tensor, valid: torch.Tensor,
                      spec: DistillationSpec) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``d`` [B, T] of forward_kl_topk (clamped at 0, as verl) and its mass and overlap metrics over ``valid``."""
    out = forward_kl_topk(student_topk_logprobs=student_topk_logprobs, teacher_topk_logprobs=teacher_topk_logprobs,
                          student_topk_ids=student_topk_ids, teacher_topk_ids=teacher_topk_ids,
                          log_prob_min_clamp=spec.log_prob_min_clamp)
    metrics = {}
    for side in ("student", "teacher"):
        mass = out[f"{side}_mass"].detach()
        metrics[f"distillation/{side}_mass"] = masked_mean(mass, valid)
        metrics[f"distillation/{side}_mass_min"] = _extreme(mass, valid, largest=False)
        metrics[f"distillation/{side}_mass_max"] = _extreme(mass, valid, largest=True)
    count = out["overlap_count"]
    metrics["distillation/overlap_ratio"] = masked_mean(count.float(), valid) / spec.topk
    metrics["distillation/overlap_token_advantage"] = masked_mean(out["overlap_token_advantage"].detach(),
                                                                  valid & (count > 0))
    return out["distillation_losses"].clamp_min(0.0), metrics


def _extreme(values: torch.Tensor, valid: torch.Tensor, largest: bool) -> torch.Tensor:
    fill = torch.finfo(values.dtype).min if largest else torch.finfo(values.dtype).max
    picked = torch.where(valid, values, torch.full_like(values, fill))
    out = picked.max() if largest else picked.min()
    return torch.where(valid.any(), out, torch.zeros_like(out))


def distillation_loss(*, inputs: PolicyLossInputs, spec: DistillationSpec, teacher_logprobs: torch.Tensor | None = None,
                      topk: dict[str, torch.Tensor] | None = None) -> LossOutput:
    """``L_distill`` of one micro-batch and its metrics. ``inputs``: the actor's policy-loss inputs (the student's
    ``logprobs`` with gradient, ``old_logprobs``, mask, aggregation and denominators); only their clip ratios are
    replaced by the distillation's in the policy-gradient form. The estimators read ``teacher_logprobs`` [B, T] (at
    the sampled tokens); forward_kl_topk reads ``topk``: ``student_topk_logprobs`` (with gradient),
    ``teacher_topk_logprobs``, ``student_topk_ids``, ``teacher_topk_ids``, each [B, T, K]."""
    valid = inputs.response_mask.bool()
    if spec.uses_topk:
        if topk is None:
            raise ValueError(f"loss_mode={spec.loss_mode} needs the student's and the teacher's top-k (topk=...)")
        losses, metrics = topk_token_losses(**topk, valid=valid, spec=spec)
    else:
        if teacher_logprobs is None:
            raise ValueError(f"loss_mode={spec.loss_mode} needs the teacher's log-probs (teacher_logprobs=...)")
        losses = distillation_token_losses(student_logprobs=inputs.logprobs, teacher_logprobs=teacher_logprobs,
                                           loss_mode=spec.loss_mode)
        metrics = {"distillation/abs_loss": masked_mean(losses.detach().abs(), valid)}
    detached = losses.detach()
    metrics |= {"distillation/loss_min": _extreme(detached, valid, largest=False),
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
