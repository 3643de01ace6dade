"""Advantage estimators: the registry ``ADV_ESTIMATORS`` (config key ``algorithm.adv_estimator``, default ``gae``).

Every estimator has ONE signature, ``fn(inputs: AdvantageInputs) -> AdvantageOutput``, so the trainer calls
``compute_advantages(adv_estimator=name, inputs=...)`` without branching on the name; fields an estimator does not
use are ignored, and a missing field it needs fails with a ValueError naming it.

Conventions (verl's, so that verl configs reproduce verl's numbers):

- Inputs are token-level: ``token_level_rewards`` [B, T] (scores, minus ``beta * kl`` when the KL is in the reward)
  and ``response_mask`` [B, T]. Outcome estimators use the sequence score ``s_i = sum_t r_{i,t}`` (the reward
  manager puts the score on the last valid token) and broadcast one scalar advantage over the valid tokens.
- Outputs ``advantages`` and ``returns`` are [B, T] and zero outside the mask. Outcome estimators return their
  advantages as returns too (no critic uses them).
- Groups: samples of the same prompt share a group id (``index``). Group std is unbiased (``torch.std``), as in
  verl; a group of one sample has baseline 0 and std 1 (see :mod:`npu_rl.core.groups`). Nothing produces NaN.
- Whitening (``gae``, ``reinforce_plus_plus``, ``reinforce_plus_plus_baseline``) is over the whole batch passed in,
  with the unbiased variance: call the estimator once on the whole batch, not per micro-batch.
- Everything runs under ``torch.no_grad()``; group statistics are vectorised (``index_add_``), the GAE and
  discounted-return recursions loop over ``T`` with the batch vectorised.

Estimators (s = sequence score, mu / sigma = group mean / unbiased std, n = group size, eps = ``epsilon``):

- ``gae``: Generalized Advantage Estimation (Schulman et al. 2015, arXiv:1506.02438).
  ``delta_t = r_t + gamma V_{t+1} - V_t``; ``A_t = delta_t + gamma lam A_{t+1}``; returns ``A + V``; advantages are
  then whitened. Masked positions inside a response (multi-turn observation tokens) are skipped: the next value and
  the running advantage carry through them.
- ``grpo``: ``(s - mu) / (sigma + eps)``, or ``s - mu`` with ``norm_adv_by_std_in_grpo=False`` (Dr. GRPO,
  arXiv:2503.20783). GRPO: Shao et al. 2024, arXiv:2402.03300.
- ``rloo``: leave-one-out baseline ``s - mean of the others = n / (n - 1) (s - mu)`` (arXiv:2402.14740).
- ``opo``: length-weighted baseline ``s - sum_j |y_j| s_j / sum_j |y_j|`` (On-Policy RL with Optimal reward
  baseline, arXiv:2505.23585).
- ``gpg``: ``alpha (s - mu)`` with ``alpha = B / #(s != 0)`` over the batch (Group Policy Gradient,
  arXiv:2504.02546).
- ``grpo_passk``: only the best sample of a group gets a non-zero advantage, ``s_max - s_second``, divided by
  ``sigma + eps`` when ``norm_adv_by_std_in_grpo`` (Pass@k training, arXiv:2503.19595). Ties give 0. A group of one
  sample gets 0 (verl raises there).
- ``reinforce_plus_plus``: discounted return ``G_t = r_t + gamma G_{t+1}`` per token, whitened over the batch
  (REINFORCE++, arXiv:2501.03262). Returns are the unwhitened ``G``.
- ``reinforce_plus_plus_baseline``: ``s - mu`` broadcast over tokens, then whitened over the batch (same paper).
- ``remax``: ``G_t - b`` with ``G_t`` the undiscounted reward-to-go and ``b`` the greedy response's reward
  (``reward_baselines`` [B]) (ReMax, arXiv:2310.10505).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from npu_rl.core.aggregation import masked_whiten
from npu_rl.core.checked_registry import CheckedRegistry, describe_callable
from npu_rl.core.groups import as_group_ids, group_stats, group_sum


@dataclass(frozen=True, eq=False)
class AdvantageInputs:
    """Everything any advantage estimator may read; each uses what it needs."""

    token_level_rewards: torch.Tensor  # [B, T]
    response_mask: torch.Tensor  # [B, T] 1 on response tokens that count
    index: Any = None  # [B] group ids: int tensor, numpy array of ints or strings (uids), or a list
    values: torch.Tensor | None = None  # [B, T] critic values (gae)
    reward_baselines: torch.Tensor | None = None  # [B] reward of the greedy response (remax)
    gamma: float = 1.0  # algorithm.gamma
    lam: float = 1.0  # algorithm.lam
    norm_adv_by_std_in_grpo: bool = True  # algorithm.norm_adv_by_std_in_grpo
    epsilon: float = 1e-6  # added to the group std


class AdvantageOutput(NamedTuple):
    advantages: torch.Tensor  # [B, T]
    returns: torch.Tensor  # [B, T]


ADV_ESTIMATORS = CheckedRegistry(
    "advantage estimator",
    "algorithm.adv_estimator",
    expected="fn(inputs: AdvantageInputs) -> AdvantageOutput(advantages [B, T], returns [B, T])",
    probe_args=(None,),
)


def needs(*fields: str):
    """Declare the optional :class:`AdvantageInputs` fields an estimator reads, so the trainer knows what to produce
    (``values``: a critic; ``reward_baselines``: a greedy rollout per prompt) without testing the estimator's name.
    A plug-in declares them the same way, or with a ``needs`` attribute."""
    known = {"values", "reward_baselines"}
    unknown = set(fields) - known
    if unknown:
        raise ValueError(f"needs(): unknown AdvantageInputs fields {sorted(unknown)}; known: {sorted(known)}")

    def decorate(fn):
        fn.needs = frozenset(fields)
        return fn

    return decorate


def estimator_needs(adv_estimator: str) -> frozenset[str]:
    """The optional inputs the estimator named ``adv_estimator`` declared with :func:`needs`."""
    return frozenset(getattr(ADV_ESTIMATORS.get(adv_estimator), "needs", ()))


def compute_advantages(*, adv_estimator: str, inputs: AdvantageInputs) -> AdvantageOutput:
    """Run the estimator named ``adv_estimator`` (a registered name or a plug-in path) and check its output."""
    fn = ADV_ESTIMATORS.get(adv_estimator)
    with torch.no_grad():
        result = fn(inputs)
    shape = tuple(inputs.token_level_rewards.shape)
    ok = isinstance(result, tuple) and len(result) == 2
    ok = ok and all(isinstance(t, torch.Tensor) and tuple(t.shape) == shape for t in result)
    if not ok:
        got = type(result).__name__ if not isinstance(result, tuple) else [getattr(t, "shape", t) for t in result]
        raise TypeError(
            f"advantage estimator {adv_estimator!r} ({describe_callable(fn)}) returned {got}; expected "
            f"(advantages, returns), two tensors of shape {list(shape)}"
        )
    return AdvantageOutput(*result)


# ------------------------------------------------------------------------------------------------------- helpers


def _require(inputs: AdvantageInputs, field: str, estimator: str) -> torch.Tensor:
    value = getattr(inputs, field)
    if value is None:
        raise ValueError(f"advantage estimator {estimator!r} needs AdvantageInputs.{field}")
    return value


def _scores_and_groups(inputs: AdvantageInputs, estimator: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence scores [B] and contiguous group ids [B]."""
    index = _require(inputs, "index", estimator)
    scores = inputs.token_level_rewards.sum(dim=-1)
    ids = as_group_ids(index, num_samples=scores.shape[0], device=scores.device)
    return scores, ids


def _broadcast(per_sequence: torch.Tensor, inputs: AdvantageInputs) -> AdvantageOutput:
    """One scalar per sequence [B] -> [B, T] on valid tokens, returned as advantages and returns."""
    mask = inputs.response_mask.to(per_sequence.dtype)
    advantages = per_sequence.unsqueeze(-1) * mask
    return AdvantageOutput(advantages, advantages)


def _discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma G_{t+1}`` over valid tokens; masked tokens are skipped (G carries through) and get 0."""
    valid = mask.bool()
    running = torch.zeros_like(rewards[:, 0])  # [B]
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        candidate = rewards[:, t] + gamma * running
        running = torch.where(valid[:, t], candidate, running)
        returns[:, t] = torch.where(valid[:, t], candidate, torch.zeros_like(candidate))
    return returns


# ---------------------------------------------------------------------------------------------------- estimators


@ADV_ESTIMATORS.register("gae")
@needs("values")
def gae_advantages(inputs: AdvantageInputs) -> AdvantageOutput:
    """GAE(gamma, lam) with a critic's ``values`` [B, T]; advantages whitened over the batch."""
    rewards = inputs.token_level_rewards  # [B, T]
    values = _require(inputs, "values", "gae").to(rewards.dtype)  # [B, T]
    valid = inputs.response_mask.bool()  # [B, T]
    gamma, lam = inputs.gamma, inputs.lam
    next_value = torch.zeros_like(rewards[:, 0])  # [B] V_{t+1} of the next valid token
    running = torch.zeros_like(rewards[:, 0])  # [B] A_{t+1}
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        candidate = delta + gamma * lam * running
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        running = torch.where(valid[:, t], candidate, running)
        advantages[:, t] = running
    mask = valid.to(rewards.dtype)
    returns = (advantages + values) * mask
    return AdvantageOutput(masked_whiten(advantages, valid) * mask, returns)


@ADV_ESTIMATORS.register("grpo")
def grpo_advantages(inputs: AdvantageInputs) -> AdvantageOutput:
    """``(s - mu) / (sigma + eps)`` per group, or ``s - mu`` (Dr. GRPO) when not normalising by std."""
    scores, ids = _scores_and_groups(inputs, "grpo")
    stats = group_stats(scores, ids)
    centered = scores - stats.mean[ids]
    if inputs.norm_adv_by_std_in_grpo:
        centered = centered / (stats.std[ids] + inputs.epsilon)
    return _broadcast(centered, inputs)


@ADV_ESTIMATORS.register("rloo")
def rloo_advantages(inputs: AdvantageInputs) -> AdvantageOutput:
    """Leave-one-out baseline: ``n / (n - 1) * (s - mu)``; a group of one keeps its score."""
    scores, ids = _scores_and_groups(inputs, "rloo")
    stats = group_stats(scores, ids)
    n = stats.count[ids]
    leave_one_out = (scores - stats.mean[ids]) * n / (n - 1).clamp(min=1)
    return _broadcast(torch.where(n > 1, leave_one_out, scores), inputs)


@ADV_ESTIMATORS.register("opo")
def opo_advantages(inputs: AdvantageInputs) -> AdvantageOutput:
    """Length-weighted group baseline ``sum |y| s / sum |y|``; a group of one has baseline 0."""
    scores, ids = _scores_and_groups(inputs, "opo")
    stats = group_stats(scores, ids)
    lengths = inputs.response_mask.to(scores.dtype).sum(dim=-1)  # [B]
    baseline = group_sum(lengths * scores, ids) / group_sum(lengths, ids).clamp(min=1)
    baseline = torch.where(stats.constant, stats.mean, baseline)  # exact for all-equal scores
    baseline = torch.where(stats.count > 1, baseline, torch.zeros_like(baseline))
    return _broadcast(scores - baseline[ids], inputs)


@ADV_ESTIMATORS.register("gpg")
def gpg_advantages(inputs: AdvantageInputs) -> AdvantageOutput:
    """``alpha * (s - mu)``, ``alpha = B / max(#(s != 0), 1)`` over the batch passed in."""
    scores, ids = _scores_and_groups(inputs, "gpg")
    stats = group_stats(scores, ids)
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1).to(scores.dtype)
    return _broadcast(alpha * (scores - stats.mean[ids]), inputs)


@ADV_ESTIMATORS.register("grpo_passk")
def grpo_passk_advantages(inputs: AdvantageInputs) -> AdvantageOutput:
    """The first best sample of each group gets ``s_max - s_second`` (over ``sigma + eps``); all others 0."""
    scores, ids = _scores_and_groups(inputs, "grpo_passk")
    batch = scores.shape[0]
    stats = group_stats(scores, ids)
    neg_inf = torch.full_like(scores, float("-inf"))
    best = neg_inf.scatter_reduce(0, ids, scores, reduce="amax")  # [B] per group
    positions = torch.arange(batch, device=scores.device)
    is_best = scores == best[ids]
    first_best = torch.full_like(positions, batch).scatter_reduce(
        0, ids, torch.where(is_best, positions, torch.full_like(positions, batch)), reduce="amin"
    )  # [B] per group: index of the first sample reaching the maximum
    is_winner = positions == first_best[ids]
    second = neg_inf.scatter_reduce(0, ids, torch.where(is_winner, neg_inf, scores), reduce="amax")
    gap = best[ids] - second[ids]
    if inputs.norm_adv_by_std_in_grpo:
        gap = gap / (stats.std[ids] + inputs.epsilon)
    advantage = torch.where(is_winner & (stats.count[ids] > 1), gap, torch.zeros_like(gap))
    return _broadcast(advantage, inputs)


@ADV_ESTIMATORS.register("reinforce_plus_plus")
def reinforce_plus_plus_advantages(inputs: AdvantageInputs) -> AdvantageOutput:
    """Discounted token returns (``gamma``), whitened over the batch; returns are the raw discounted returns."""
    mask = inputs.response_mask
    returns = _discounted_returns(inputs.token_level_rewards, mask, inputs.gamma)
    advantages = masked_whiten(returns, mask) * mask.to(returns.dtype)
    return AdvantageOutput(advantages, returns)


@ADV_ESTIMATORS.register("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline_advantages(inputs: AdvantageInputs) -> AdvantageOutput:
    """``s - mu`` per group broadcast over tokens, then whitened over the batch."""
    scores, ids = _scores_and_groups(inputs, "reinforce_plus_plus_baseline")
    stats = group_stats(scores, ids)
    mask = inputs.response_mask
    centered = _broadcast(scores - stats.mean[ids], inputs).advantages
    advantages = masked_whiten(centered, mask) * mask.to(centered.dtype)
    return AdvantageOutput(advantages, advantages)


@ADV_ESTIMATORS.register("remax")
@needs("reward_baselines")
def remax_advantages(inputs: AdvantageInputs) -> AdvantageOutput:
    """Reward-to-go minus the greedy response's reward ``reward_baselines`` [B]."""
    rewards = inputs.token_level_rewards
    baselines = _require(inputs, "reward_baselines", "remax").to(rewards.dtype).reshape(-1)  # [B]
    mask = inputs.response_mask.to(rewards.dtype)
    returns = (rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1]) * mask  # [B, T]
    return AdvantageOutput((returns - baselines.unsqueeze(-1)) * mask, returns)
