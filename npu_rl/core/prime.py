"""PRIME: the implicit process reward model, its cross-entropy loss, its RLOO advantages and the group filter.

verl-recipe's ``prime`` (verl-project/verl-recipe at 48ea0a7: prime/prime_core_algos.py, prime/prime_dp_rm.py,
prime/prime_ray_trainer.py). The implicit PRM is a causal LM ``pi_rm`` (a trainable copy of the policy) read
against a frozen reference ``pi_ref``; for a response ``y`` with valid tokens ``t = 0..L-1`` and outcome ``acc``::

    q_t = log pi_rm(y_t | y_<t) - log pi_ref(y_t | y_<t)         (0 outside the response mask)
    r_t = beta_train * q_t                                       (reward_model.model.beta_train)
    token granularity: score_t = r_t for t < L-1, 0 at the last token (as verl: the outcome lands there)
    whole granularity: score_{L-1} = sum_t r_t, 0 elsewhere
    prime_norm=batch_norm: score <- score / (max over the batch of |sum_{s>=t} score_s| + 1e-6)

    CE loss of the PRM (loss_type=ce):  BCE(sigmoid(beta_train * sum_t q_t), acc), mean over the batch

Advantages (``algorithm.adv_estimator=rloo`` with the PRIME reward): RLOO on each reward source apart, per group of
``n`` samples, then summed with the coefficients::

    rloo(x)_i,t = x_i,t * n / (n-1) - (sum_j mean_t x_j,t) / (n-1)       on the source's mask, 0 elsewhere
    final = reward_dpo_coef * rloo(score; response mask) + reward_gt_coef * rloo(acc at the last token)
    returns_t = sum_{s>=t} final_s;  advantages = whiten(returns) over the batch's response tokens

Groups are the samples sharing a group id (verl assumes ``n`` consecutive rows); a group of one sample has no
leave-one-out baseline and is refused at validation (``rollout.n >= 2``). The group filter (``data.filter_accuracy``,
``data.filter_truncate``) keeps groups whose mean accuracy lies in ``[lower, upper]`` and whose longest response is
shorter than ``max_response_length - 1``, then keeps the first ``keep`` groups with passing groups first; the order
is stable here (verl's ``torch.argsort`` is not, so which of many passing groups it keeps is unspecified).

Metrics (the worker prefixes ``reward_model/``): ``dpo_acc`` (pairwise ranking accuracy of ``sum_t score_t`` against
``acc`` within groups, weighted by |acc_i - acc_j|, 0.5 for a group with equal outcomes) and ``dpo_acc_abs``
(``sign(sum_t score_t) == sign(2 acc - 1)``).
"""

from __future__ import annotations

import torch

from npu_rl.core.aggregation import masked_mean, masked_whiten
from npu_rl.core.groups import group_sum

GRANULARITIES: tuple[str, ...] = ("token", "whole")
NORMS: tuple[str, ...] = ("batch_norm", "none")
LOSS_TYPES: tuple[str, ...] = ("ce",)  # verl's dpo / bon_acc / bon_rm need update=reverse: not implemented


def last_token_mask(response_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: True at the last valid token of each row (no True in a row with no valid token)."""
    mask = response_mask.bool()
    count = mask.sum(dim=-1, keepdim=True)
    return mask & (mask.long().cumsum(dim=-1) == count)


def implicit_log_ratio(*, rm_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, response_mask: torch.Tensor
                       ) -> torch.Tensor:
    """``q`` [B, T] = log pi_rm - log pi_ref on the response mask, 0 elsewhere (keeps the PRM's gradient)."""
    return torch.where(response_mask.bool(), rm_logprobs - ref_logprobs.to(rm_logprobs.dtype),
                       torch.zeros_like(rm_logprobs))


def implicit_token_scores(q: torch.Tensor, response_mask: torch.Tensor, *, beta: float, granularity: str = "token",
                          norm: str = "batch_norm") -> torch.Tensor:
    """The PRM's token scores [B, T] from ``q`` (module docstring); no gradient."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"reward_model.prime_granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if norm not in NORMS:
        raise ValueError(f"reward_model.prime_norm must be one of {NORMS}, got {norm!r}")
    with torch.no_grad():
        mask = response_mask.bool()
        last = last_token_mask(mask)
        r = torch.where(mask, q.detach() * beta, torch.zeros_like(q))
        if granularity == "token":
            scores = torch.where(last, torch.zeros_like(r), r)
        else:
            scores = torch.where(last, r.sum(dim=-1, keepdim=True), torch.zeros_like(r))
        if norm == "batch_norm":
            reverse_cumsum = scores.flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
            scores = scores / (reverse_cumsum.abs().max() + 1e-6)
    return scores


def implicit_prm_ce_loss(q: torch.Tensor, acc: torch.Tensor, response_mask: torch.Tensor, *, beta: float
                         ) -> torch.Tensor:
    """BCE(sigmoid(beta * sum_t q_t), acc), mean over the rows (0-d, differentiable through ``q``).

    Computed from the logit (``binary_cross_entropy_with_logits``): equal to verl's sigmoid-then-BCE where that is
    finite, and without its clamp of log(0) to -100 when the sigmoid saturates."""
    logit = torch.where(response_mask.bool(), q, torch.zeros_like(q)).sum(dim=-1) * beta
    return torch.nn.functional.binary_cross_entropy_with_logits(logit, acc.to(logit.dtype))


def _masked_rloo(values: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Leave-one-out on ``values`` [B, T] over ``mask`` per group (module docstring); 0 outside the mask."""
    mask = mask.bool()
    means = masked_mean(values, mask, dim=-1)  # [B]
    count = group_sum(torch.ones_like(means), group_ids)[group_ids]  # [B] samples in each row's group
    baseline = group_sum(means, group_ids)[group_ids] / (count - 1)
    scaled = values * (count / (count - 1)).unsqueeze(-1) - baseline.unsqueeze(-1)
    return torch.where(mask, scaled, torch.zeros_like(values))


def prime_rloo_advantages(*, token_scores: torch.Tensor | None, acc: torch.Tensor | None,
                          response_mask: torch.Tensor, group_ids: torch.Tensor, reward_dpo_coef: float,
                          reward_gt_coef: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) [B, T] from the PRM's token scores and the outcome ``acc`` [B] (module docstring).

    A source that is None or whose coefficient is 0 is left out, as verl leaves out a missing key."""
    mask = response_mask.bool()
    final = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    if token_scores is not None and reward_dpo_coef != 0.0:
        final = final + _masked_rloo(token_scores.float(), mask, group_ids) * reward_dpo_coef
    if acc is not None and reward_gt_coef != 0.0:
        last = last_token_mask(mask)
        outcome = torch.where(last, acc.float().unsqueeze(-1), torch.zeros_like(final))
        final = final + _masked_rloo(outcome, last, group_ids) * reward_gt_coef
    returns = torch.where(mask, final, torch.zeros_like(final)).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    advantages = masked_whiten(returns, mask) * mask.to(returns.dtype)
    return advantages, returns


def group_filter_mask(*, acc: torch.Tensor, response_lengths: torch.Tensor, group_ids: torch.Tensor,
                      filter_accuracy: bool, lower: float, upper: float, filter_truncate: bool,
                      max_response_length: int) -> torch.Tensor:
    """[B] bool per sample: its group passes the accuracy and truncation filters (module docstring)."""
    count = group_sum(torch.ones_like(acc, dtype=torch.float32), group_ids)
    passes = torch.ones(acc.shape, dtype=torch.bool, device=acc.device)
    if filter_accuracy:
        mean = group_sum(acc.float(), group_ids) / count.clamp(min=1)
        passes = passes & (mean[group_ids] >= lower) & (mean[group_ids] <= upper)
    if filter_truncate:
        longest = torch.zeros_like(count).scatter_reduce(0, group_ids, response_lengths.float(), reduce="amax")
        passes = passes & (longest[group_ids] < max_response_length - 1)
    return passes


def prioritised_keep(passes: torch.Tensor, group_ids: torch.Tensor, *, keep_groups: int, n: int) -> torch.Tensor:
    """Indices [keep_groups * n] of the samples to keep: the first ``keep_groups`` groups, passing groups first,
    each kind in order of first appearance, a group's samples in batch order (every group has ``n`` samples)."""
    rows = torch.arange(passes.numel(), device=passes.device)
    first_row = torch.full_like(group_ids, passes.numel()).scatter_reduce(0, group_ids, rows, reduce="amin")
    rank = first_row[group_ids] + (~passes).long() * passes.numel()  # failing groups after every passing one
    return torch.argsort(rank, stable=True)[: keep_groups * n]


def dpo_accuracy(token_scores: torch.Tensor, acc: torch.Tensor, response_mask: torch.Tensor, group_ids: torch.Tensor
                 ) -> torch.Tensor:
    """verl's ``reward_model/dpo_acc``: weighted pairwise ranking accuracy within groups, mean over groups."""
    total = torch.where(response_mask.bool(), token_scores, torch.zeros_like(token_scores)).sum(dim=-1)
    same = group_ids.unsqueeze(0) == group_ids.unsqueeze(1)
    upper = torch.triu(torch.ones_like(same), diagonal=1) & same
    acc_diff = acc.float().unsqueeze(1) - acc.float().unsqueeze(0)
    score_diff = total.unsqueeze(1) - total.unsqueeze(0)
    weight = torch.where(upper, acc_diff.abs(), torch.zeros_like(acc_diff))
    right = ((score_diff > 0) == (acc_diff > 0)).float() * weight
    per_group_weight = weight.sum(dim=1).new_zeros(group_ids.shape).index_add_(0, group_ids, weight.sum(dim=1))
    per_group_right = right.sum(dim=1).new_zeros(group_ids.shape).index_add_(0, group_ids, right.sum(dim=1))
    present = torch.zeros_like(group_ids, dtype=torch.bool).index_fill_(0, group_ids, True)
    per_group = torch.where(per_group_weight > 0, per_group_right / per_group_weight.clamp(min=1e-12),
                            torch.full_like(per_group_weight, 0.5))
    return masked_mean(per_group, present)


def dpo_abs_accuracy(token_scores: torch.Tensor, acc: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """verl's ``reward_model/dpo_acc_abs``: the sign of the summed score agrees with ``2 acc - 1``."""
    total = torch.where(response_mask.bool(), token_scores, torch.zeros_like(token_scores)).sum(dim=-1)
    return (torch.sign(total) == torch.sign(acc.float() * 2 - 1)).float().mean()
