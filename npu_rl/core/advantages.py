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
- ``grpo_vectorized``: verl's second name for ``grpo`` (ours is vectorised already): the same function.
- ``rloo_vectorized``: ``rloo``, except that a group of one sample gets advantage 0 (verl's vectorised RLOO does
  that; its loop version, our ``rloo``, keeps the raw score).
- ``gdpo``: group reward-decoupled normalisation (GDPO, arXiv:2601.05242): each reward component ``k``
  (``reward_components``, [B] each, named by ``algorithm.gdpo_reward_keys``) is GRPO-normalised within its groups
  on its own, the results are summed with weights ``w_k`` (``algorithm.gdpo_reward_weights``, default 1), and the sum
  is whitened over the batch's valid tokens. Without components it is GRPO on the sequence score, then whitened.
- ``optimal_token_baseline`` (OTB): a baseline per group AND per token position ``t``:
  ``B_t = sum_i G_{i,t} W_{i,t} / (sum_i W_{i,t} + 1e-8)`` over the group's samples valid at ``t``, with ``G`` the
  undiscounted reward-to-go and ``W_{i,t} = sum_{j <= t} (1 - 2 pi_j + sum_v pi_v^2) rho_j^2`` a cumulative
  path-variance proxy (``pi_j = exp(old_logprobs)``, ``sum_v pi_v^2`` = ``sum_pi_squared`` from the actor, ``rho``
  the rollout importance weights when given, else 1). ``A = G - B``. A group of one has baseline 0. When one sample
  of a group is strictly the longest, its baseline is 0 past the second-longest length (nothing to compare with).
  Positions are columns of the [B, T] layout (verl's choice). Returns are ``G`` on valid tokens (0 elsewhere; verl
  leaves ``G`` on masked positions inside a response, which nothing reads).
- ``tir_optimal_token_baseline``: the same, but position ``t`` is the ``t``-th VALID token of each sample, so
  multi-turn responses (masked tool/observation tokens in between) line up by generated token; samples with no
  valid token are left out of their group.
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
    reward_components: tuple[torch.Tensor, ...] | None = None  # each [B]: one reward dimension (gdpo)
    reward_weights: tuple[float, ...] | None = None  # one per component (gdpo); default all 1
    old_logprobs: torch.Tensor | None = None  # [B, T] behaviour-policy log-probs (optimal token baseline)
    sum_pi_squared: torch.Tensor | None = None  # [B, T] sum over the vocabulary of pi^2 (optimal token baseline)
    rollout_is_weights: torch.Tensor | None = None  # [B, T] rollout importance weights (optimal token baseline)
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
    known = {"values", "reward_baselines", "reward_components", "old_logprobs", "sum_pi_squared"}
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


ADV_ESTIMATORS.register("grpo_vectorized")(grpo_advantages)


@ADV_ESTIMATORS.register("rloo_vectorized")
def rloo_vectorized_advantages(inputs: AdvantageInputs) -> AdvantageOutput:
    """Leave-one-out baseline ``n / (n - 1) * (s - mu)``; a group of one gets 0 (unlike ``rloo``)."""
    scores, ids = _scores_and_groups(inputs, "rloo_vectorized")
    stats = group_stats(scores, ids)
    n = stats.count[ids]
    leave_one_out = (scores - stats.mean[ids]) * n / (n - 1).clamp(min=1)
    return _broadcast(torch.where(n > 1, leave_one_out, torch.zeros_like(scores)), inputs)


def _grpo_scalars(scores: torch.Tensor, ids: torch.Tensor, inputs: AdvantageInputs) -> torch.Tensor:
    stats = group_stats(scores, ids)
    centered = scores - stats.mean[ids]
    return centered / (stats.std[ids] + inputs.epsilon) if inputs.norm_adv_by_std_in_grpo else centered


@ADV_ESTIMATORS.register("gdpo")
@needs("reward_components")
def gdpo_advantages(inputs: AdvantageInputs) -> AdvantageOutput:
    """Per-component GRPO normalisation, weighted sum, then whitening over the batch's valid tokens."""
    scores, ids = _scores_and_groups(inputs, "gdpo")
    components = [scores] if inputs.reward_components is None else [
        torch.as_tensor(c, device=scores.device).to(scores.dtype).reshape(-1) for c in inputs.reward_components
    ]
    weights = inputs.reward_weights if inputs.reward_weights is not None else (1.0,) * len(components)
    if len(weights) != len(components):
        raise ValueError(f"gdpo: {len(weights)} reward weights for {len(components)} reward components")
    combined = sum(w * _grpo_scalars(c, ids, inputs) for w, c in zip(weights, components, strict=True))
    mask = inputs.response_mask
    advantages = combined.unsqueeze(-1) * mask.to(scores.dtype)
    advantages = masked_whiten(advantages, mask) * mask.to(scores.dtype)
    return AdvantageOutput(advantages, advantages)


def _otb_inputs(inputs: AdvantageInputs, estimator: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reward-to-go ``G`` [B, T], cumulative path variance ``W`` [B, T] and group ids [B]."""
    rewards = inputs.token_level_rewards
    mask = inputs.response_mask.to(rewards.dtype)
    old_logprobs = _require(inputs, "old_logprobs", estimator).to(rewards.dtype)
    sum_pi_squared = _require(inputs, "sum_pi_squared", estimator).to(rewards.dtype)
    ids = as_group_ids(_require(inputs, "index", estimator), num_samples=rewards.shape[0], device=rewards.device)
    returns = (rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    per_token = 1.0 - 2.0 * torch.exp(old_logprobs) + sum_pi_squared
    if inputs.rollout_is_weights is not None:
        per_token = per_token * inputs.rollout_is_weights.to(rewards.dtype) ** 2
    return returns, (per_token * mask).cumsum(dim=-1), ids


def _otb_baseline(
    returns: torch.Tensor, path: torch.Tensor, mask: torch.Tensor, ids: torch.Tensor, members: torch.Tensor
) -> torch.Tensor:
    """Per-position group baseline [B, T] over the rows in ``members`` (bool [B]); see the module docstring."""
    valid = mask.to(returns.dtype) * members.to(returns.dtype).unsqueeze(-1)
    numerator = torch.zeros_like(returns).index_add_(0, ids, returns * path * valid)  # [B (groups), T]
    denominator = torch.zeros_like(returns).index_add_(0, ids, path * valid)
    baseline = (numerator / (denominator + 1e-8))[ids]  # [B, T]
    count = group_sum(members.to(returns.dtype), ids)[ids]  # [B] members of each row's group
    lengths = torch.where(members, mask.to(returns.dtype).sum(dim=-1), torch.full_like(count, float("-inf")))
    longest = torch.full_like(count, float("-inf")).scatter_reduce(0, ids, lengths, reduce="amax")[ids]
    is_longest = members & (lengths == longest)
    unique_longest = group_sum(is_longest.to(returns.dtype), ids)[ids] == 1
    shorter = torch.where(is_longest, torch.full_like(lengths, float("-inf")), lengths)
    second = torch.full_like(count, float("-inf")).scatter_reduce(0, ids, shorter, reduce="amax")[ids]
    tail_row = is_longest & unique_longest & (count > 1)  # [B]
    columns = torch.arange(returns.shape[1], device=returns.device, dtype=returns.dtype)
    in_tail = tail_row.unsqueeze(-1) & (columns.unsqueeze(0) >= second.unsqueeze(-1))
    keep = (count > 1).unsqueeze(-1) & ~in_tail
    return torch.where(keep, baseline, torch.zeros_like(baseline))


@ADV_ESTIMATORS.register("optimal_token_baseline")
@needs("old_logprobs", "sum_pi_squared")
def optimal_token_baseline_advantages(inputs: AdvantageInputs) -> AdvantageOutput:
    """``G_t - B_t`` with the path-variance-weighted group baseline per column ``t``."""
    returns, path, ids = _otb_inputs(inputs, "optimal_token_baseline")
    mask = inputs.response_mask
    members = torch.ones_like(ids, dtype=torch.bool)
    baseline = _otb_baseline(returns, path, mask, ids, members)
    mask = mask.to(returns.dtype)
    return AdvantageOutput((returns - baseline) * mask, returns * mask)


@ADV_ESTIMATORS.register("tir_optimal_token_baseline")
@needs("old_logprobs", "sum_pi_squared")
def tir_optimal_token_baseline_advantages(inputs: AdvantageInputs) -> AdvantageOutput:
    """Optimal token baseline with positions counted in valid tokens (multi-turn responses line up)."""
    returns, path, ids = _otb_inputs(inputs, "tir_optimal_token_baseline")
    valid = inputs.response_mask.bool()
    position = (valid.long().cumsum(dim=-1) - 1).clamp(min=0)  # [B, T] k for the k-th valid token
    rows = torch.arange(valid.shape[0], device=valid.device).unsqueeze(-1).expand_as(position)

    def compact(values: torch.Tensor) -> torch.Tensor:
        packed = torch.zeros_like(values)
        packed[rows[valid], position[valid]] = values[valid]
        return packed

    lengths = valid.sum(dim=-1)  # [B]
    packed_mask = torch.arange(valid.shape[1], device=valid.device).unsqueeze(0) < lengths.unsqueeze(-1)
    packed_returns = compact(returns)
    baseline = _otb_baseline(packed_returns, compact(path), packed_mask, ids, lengths > 0)
    packed_advantages = packed_returns - baseline
    advantages = torch.zeros_like(returns)
    advantages[valid] = packed_advantages[rows[valid], position[valid]]
    return AdvantageOutput(advantages, returns * valid.to(returns.dtype))
