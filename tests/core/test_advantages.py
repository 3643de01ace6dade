"""Advantage estimators: hand-computed values, the vectorised code against plain per-group loops, edge cases."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from npu_rl.core import ADV_ESTIMATORS, AdvantageInputs, as_group_ids, compute_advantages

ALL = (
    "gae",
    "grpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
    "gpg",
    "grpo_passk",
)
EPS = 1e-6


def outcome(scores, lengths=None, width=3, **kwargs) -> AdvantageInputs:
    """Sequence scores put on the last valid token of rows of ``width`` tokens (all valid unless ``lengths``)."""
    scores = torch.as_tensor(scores, dtype=torch.float32)
    lengths = torch.full((len(scores),), width) if lengths is None else torch.as_tensor(lengths)
    mask = (torch.arange(width) < lengths.unsqueeze(-1)).float()
    rewards = torch.zeros(len(scores), width)
    rows = torch.arange(len(scores))[lengths > 0]
    rewards[rows, lengths[lengths > 0] - 1] = scores[lengths > 0]
    return AdvantageInputs(token_level_rewards=rewards, response_mask=mask, **kwargs)


def first_token(name, inputs) -> torch.Tensor:
    return compute_advantages(adv_estimator=name, inputs=inputs).advantages[:, 0]


# ------------------------------------------------------------------------------------------------ by hand


def test_registry_names():
    assert set(ALL) <= set(ADV_ESTIMATORS.names())


def test_grpo_uses_unbiased_std():
    # group [1, 0]: mean 0.5; unbiased std sqrt((0.25 + 0.25) / 1) = 0.7071 (population std would be 0.5 -> +-1)
    adv = first_token("grpo", outcome([1.0, 0.0], index=[0, 0]))
    assert_close(adv, torch.tensor([0.5, -0.5]) / (math.sqrt(0.5) + EPS))


def test_grpo_three_samples_by_hand():
    # group [1, 0, 0]: mean 1/3; unbiased var ((2/3)^2 + 2 (1/3)^2) / 2 = 1/3
    adv = first_token("grpo", outcome([1.0, 0.0, 0.0], index=[7, 7, 7]))
    std = math.sqrt(1.0 / 3.0)
    assert_close(adv, torch.tensor([2.0 / 3.0, -1.0 / 3.0, -1.0 / 3.0]) / (std + EPS))


def test_grpo_without_std_is_dr_grpo():
    adv = first_token("grpo", outcome([1.0, 0.0, 0.5, 0.5], index=[0, 0, 1, 1], norm_adv_by_std_in_grpo=False))
    # means 0.5 and 0.5
    assert_close(adv, torch.tensor([0.5, -0.5, 0.0, 0.0]))


def test_grpo_broadcasts_over_valid_tokens_only():
    inputs = outcome([1.0, 0.0], lengths=[2, 3], index=["a", "a"], norm_adv_by_std_in_grpo=False)
    out = compute_advantages(adv_estimator="grpo", inputs=inputs)
    assert_close(out.advantages, torch.tensor([[0.5, 0.5, 0.0], [-0.5, -0.5, -0.5]]))
    assert_close(out.returns, out.advantages)


def test_rloo_by_hand():
    # group [1, 0, 0.5]: each minus the mean of the other two: 1 - 0.25, 0 - 0.75, 0.5 - 0.5
    adv = first_token("rloo", outcome([1.0, 0.0, 0.5], index=[3, 3, 3]))
    assert_close(adv, torch.tensor([0.75, -0.75, 0.0]))


def test_opo_length_weighted_baseline_by_hand():
    # group b: lengths 2 and 3, scores 1 and 0.5 -> baseline (2 * 1 + 3 * 0.5) / 5 = 0.7
    adv = first_token("opo", outcome([1.0, 0.5], lengths=[2, 3], index=["b", "b"]))
    assert_close(adv, torch.tensor([0.3, -0.2]))


def test_gpg_by_hand():
    # 2 of 4 scores non-zero -> alpha = 4 / 2 = 2; group means 0.5, 0.5
    adv = first_token("gpg", outcome([1.0, 0.0, 0.0, 1.0], index=[0, 0, 1, 1]))
    assert_close(adv, torch.tensor([1.0, -1.0, -1.0, 1.0]))


def test_grpo_passk_by_hand():
    # group [0, 1, 0.5]: best 1, second 0.5 -> 0.5; unbiased std of the group sqrt((0.25 + 0.25 + 0) / 2) = 0.5
    adv = first_token("grpo_passk", outcome([0.0, 1.0, 0.5, 2.0, 2.0, 0.0], index=[0, 0, 0, 1, 1, 1]))
    # group 1 ties at the top: the first best gets 2 - 2 = 0
    assert_close(adv, torch.tensor([0.0, 0.5 / (0.5 + EPS), 0.0, 0.0, 0.0, 0.0]))
    raw = first_token("grpo_passk", outcome([0.0, 1.0, 0.5], index=[0, 0, 0], norm_adv_by_std_in_grpo=False))
    assert_close(raw, torch.tensor([0.0, 0.5, 0.0]))


def test_reinforce_plus_plus_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    out = compute_advantages(
        adv_estimator="reinforce_plus_plus",
        inputs=AdvantageInputs(token_level_rewards=rewards, response_mask=mask, gamma=0.5),
    )
    # G row 0: 1 -> 0.5 -> 0.25; row 1: [1 + 0.5 * 0, 0, masked]
    returns = torch.tensor([[0.25, 0.5, 1.0], [1.0, 0.0, 0.0]])
    assert_close(out.returns, returns)
    # valid returns .25 .5 1 1 0: mean .55; squares .09 .0025 .2025 .2025 .3025 = .8; unbiased var .8 / 4 = .2
    assert_close(out.advantages, (returns - 0.55) / math.sqrt(0.2 + 1e-8) * mask)


def test_reinforce_plus_plus_skips_masked_tokens_inside_a_response():
    # an observation token (mask 0) in the middle: its reward 5 is ignored and G carries through it
    rewards = torch.tensor([[1.0, 5.0, 1.0]])
    out = compute_advantages(
        adv_estimator="reinforce_plus_plus",
        inputs=AdvantageInputs(token_level_rewards=rewards, response_mask=torch.tensor([[1, 0, 1]]), gamma=0.5),
    )
    assert_close(out.returns, torch.tensor([[1.0 + 0.5 * 1.0, 0.0, 1.0]]))


def test_reinforce_plus_plus_baseline_by_hand():
    # groups [1, 0] and [1, 1]: centred .5 -.5 0 0 over 2 tokens each -> 8 values, mean 0, sum sq 1, var 1/7
    adv = compute_advantages(
        adv_estimator="reinforce_plus_plus_baseline", inputs=outcome([1.0, 0.0, 1.0, 1.0], width=2, index=[0, 0, 1, 1])
    ).advantages
    expected = torch.tensor([0.5, -0.5, 0.0, 0.0]).unsqueeze(-1).expand(4, 2) / math.sqrt(1.0 / 7.0 + 1e-8)
    assert_close(adv, expected)


def test_remax_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out = compute_advantages(
        adv_estimator="remax",
        inputs=AdvantageInputs(
            token_level_rewards=rewards, response_mask=mask, reward_baselines=torch.tensor([0.25, 1.0])
        ),
    )
    assert_close(out.returns, torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]))  # reward-to-go
    assert_close(out.advantages, torch.tensor([[0.75, 0.75, 0.75], [0.0, 0.0, 0.0]]))


def test_gae_by_hand():
    # gamma = lam = 0.5, rewards [0, 1], values [0.5, 0.25]
    # t=1: delta = 1 + 0.5 * 0 - 0.25 = 0.75 -> A1 = 0.75
    # t=0: delta = 0 + 0.5 * 0.25 - 0.5 = -0.375 -> A0 = -0.375 + 0.25 * 0.75 = -0.1875
    # returns = A + V = [0.3125, 1.0]; two whitened values are -+ 1 / sqrt(2) (up to the 1e-8 in the root)
    inputs = AdvantageInputs(
        token_level_rewards=torch.tensor([[0.0, 1.0]]),
        response_mask=torch.tensor([[1, 1]]),
        values=torch.tensor([[0.5, 0.25]]),
        gamma=0.5,
        lam=0.5,
    )
    out = compute_advantages(adv_estimator="gae", inputs=inputs)
    assert_close(out.returns, torch.tensor([[0.3125, 1.0]]))
    assert_close(out.advantages, torch.tensor([[-1.0, 1.0]]) / math.sqrt(2.0))


def test_gae_skips_masked_tokens_inside_a_response():
    # the middle token is masked: its reward 9 and value 7 are skipped; the same numbers as above result
    inputs = AdvantageInputs(
        token_level_rewards=torch.tensor([[0.0, 9.0, 1.0]]),
        response_mask=torch.tensor([[1, 0, 1]]),
        values=torch.tensor([[0.5, 7.0, 0.25]]),
        gamma=0.5,
        lam=0.5,
    )
    out = compute_advantages(adv_estimator="gae", inputs=inputs)
    assert_close(out.returns, torch.tensor([[0.3125, 0.0, 1.0]]))


# ------------------------------------------------------------------------------------ against plain loops


def loop_group_baselines(name, scores, index, lengths, norm=True):
    """A plain per-group loop, written from the formulas (float64)."""
    groups = defaultdict(list)
    for i, label in enumerate(index):
        groups[label].append(i)
    out = [0.0] * len(scores)
    nonzero = sum(1 for s in scores if s != 0)
    for members in groups.values():
        group = [scores[i] for i in members]
        n = len(group)
        mean = sum(group) / n if n > 1 else 0.0
        std = math.sqrt(sum((s - sum(group) / n) ** 2 for s in group) / (n - 1)) if n > 1 else 1.0
        for i in members:
            if name == "grpo":
                out[i] = (scores[i] - mean) / (std + EPS) if norm else scores[i] - mean
            elif name == "rloo":
                out[i] = scores[i] - (sum(group) - scores[i]) / (n - 1) if n > 1 else scores[i]
            elif name == "opo":
                weights = [lengths[j] for j in members]
                baseline = sum(w * s for w, s in zip(weights, group)) / max(sum(weights), 1) if n > 1 else 0.0
                out[i] = scores[i] - baseline
            elif name == "gpg":
                out[i] = len(scores) / max(nonzero, 1) * (scores[i] - mean)
            elif name == "grpo_passk":
                best = max(range(n), key=lambda k: (group[k], -k))  # the first best
                others = [group[k] for k in range(n) if k != best]
                gap = group[best] - max(others) if others else 0.0
                out[i] = (gap / (std + EPS) if norm else gap) if (members.index(i) == best and n > 1) else 0.0
            else:
                out[i] = scores[i] - mean  # reinforce_plus_plus_baseline before whitening
    return torch.tensor(out, dtype=torch.float64)


def random_batch(seed, num_groups=7):
    gen = torch.Generator().manual_seed(seed)
    sizes = [1, 2, 5, 3, 1, 4, 8][:num_groups]
    labels = [f"uid-{g:03d}" for g, size in enumerate(sizes) for _ in range(size)]
    batch, width = len(labels), 6
    perm = torch.randperm(batch, generator=gen)
    labels = [labels[i] for i in perm]
    lengths = torch.randint(1, width + 1, (batch,), generator=gen)
    lengths[3] = 0  # an all-masked row
    mask = (torch.arange(width) < lengths.unsqueeze(-1)).double()
    rewards = torch.randn(batch, width, generator=gen, dtype=torch.float64) * mask
    rewards[labels.index("uid-002")] = 0.0  # some zero scores (gpg's alpha)
    for i, label in enumerate(labels):  # one all-equal group
        if label == "uid-003":
            rewards[i] = 0.0
            rewards[i, 0] = 0.5 if lengths[i] > 0 else 0.0
    return rewards, mask, np.array(labels), lengths


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo", "gpg", "grpo_passk", "reinforce_plus_plus_baseline"])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_vectorised_matches_loop(name, norm, seed):
    rewards, mask, labels, lengths = random_batch(seed)
    inputs = AdvantageInputs(
        token_level_rewards=rewards, response_mask=mask, index=labels, norm_adv_by_std_in_grpo=norm
    )
    out = compute_advantages(adv_estimator=name, inputs=inputs)
    scores = rewards.sum(-1).tolist()
    expected = loop_group_baselines(name, scores, labels.tolist(), lengths.tolist(), norm).unsqueeze(-1) * mask
    if name == "reinforce_plus_plus_baseline":
        valid = expected[mask.bool()]
        expected = (expected - valid.mean()) / torch.sqrt(valid.var() + 1e-8) * mask  # torch.var is unbiased
    assert_close(out.advantages, expected)


def loop_gae(rewards, values, mask, gamma, lam):
    """Per sample, per token, in plain Python."""
    advantages = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        valid = [t for t in range(rewards.shape[1]) if mask[b, t] > 0]
        running = 0.0
        for k in reversed(range(len(valid))):
            t = valid[k]
            next_value = values[b, valid[k + 1]].item() if k + 1 < len(valid) else 0.0
            delta = rewards[b, t].item() + gamma * next_value - values[b, t].item()
            running = delta + gamma * lam * running
            advantages[b, t] = running
    return advantages


def test_gae_matches_loop_with_holes():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    values = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    mask = (torch.rand(5, 7, generator=gen) > 0.3).double()
    mask[2] = 0.0  # an all-masked row
    inputs = AdvantageInputs(token_level_rewards=rewards, response_mask=mask, values=values, gamma=0.9, lam=0.8)
    out = compute_advantages(adv_estimator="gae", inputs=inputs)
    raw = loop_gae(rewards, values, mask, 0.9, 0.8)
    assert_close(out.returns, (raw + values) * mask)
    valid = raw[mask.bool()]
    assert_close(out.advantages, (raw - valid.mean()) / torch.sqrt(valid.var() + 1e-8) * mask)


def test_reinforce_plus_plus_matches_loop():
    gen = torch.Generator().manual_seed(1)
    rewards = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    mask = (torch.rand(4, 6, generator=gen) > 0.3).double()
    out = compute_advantages(
        adv_estimator="reinforce_plus_plus",
        inputs=AdvantageInputs(token_level_rewards=rewards, response_mask=mask, gamma=0.7),
    )
    expected = torch.zeros_like(rewards)
    for b in range(4):
        running = 0.0
        for t in reversed(range(6)):
            if mask[b, t] > 0:
                running = rewards[b, t].item() + 0.7 * running
                expected[b, t] = running
    assert_close(out.returns, expected)


# ------------------------------------------------------------------------------------------------- edges


def everything(rewards, mask, index):
    return AdvantageInputs(
        token_level_rewards=rewards,
        response_mask=mask,
        index=index,
        values=torch.zeros_like(rewards),
        reward_baselines=torch.zeros(rewards.shape[0]),
    )


@pytest.mark.parametrize("name", ALL)
def test_singletons_all_masked_and_length_one_give_no_nan(name):
    rewards = torch.tensor([[1.0], [0.0], [0.5], [0.0]])  # response length 1
    mask = torch.tensor([[1.0], [1.0], [1.0], [0.0]])  # the last row all masked
    out = compute_advantages(adv_estimator=name, inputs=everything(rewards, mask, np.array([10, 11, 12, 12])))
    assert torch.isfinite(out.advantages).all() and torch.isfinite(out.returns).all()
    assert_close(out.advantages[3], torch.zeros(1))  # nothing outside the mask
    single = compute_advantages(adv_estimator=name, inputs=everything(rewards[:1], mask[:1], [0]))
    assert torch.isfinite(single.advantages).all()


def test_singleton_group_conventions():
    # a group of one: baseline 0, std 1 (verl's convention) -> GRPO keeps the raw score; passk gives 0
    assert_close(first_token("grpo", outcome([0.7], index=[0])), torch.tensor([0.7 / (1.0 + EPS)]))
    assert_close(first_token("rloo", outcome([0.7], index=[0])), torch.tensor([0.7]))
    assert_close(first_token("grpo_passk", outcome([0.7], index=[0])), torch.tensor([0.0]))


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo", "gpg", "grpo_passk", "reinforce_plus_plus_baseline"])
def test_all_equal_rewards_give_zero(name):
    adv = first_token(name, outcome([0.25, 0.25, 0.25, 1.0, 1.0], index=[0, 0, 0, 1, 1]))
    assert_close(adv, torch.zeros(5))


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline"])
@pytest.mark.parametrize("value, size", [(0.7, 16), (0.1, 7), (0.3, 7)])
def test_all_equal_rewards_give_exactly_zero_despite_rounding(name, value, size):
    # float32: 16 x 0.7 summed and divided by 16 is not 0.7; (0.7 - mean) / (0 + 1e-6) was ~0.1 before the fix
    adv = first_token(
        name, outcome([value] * size, lengths=[1, 2, 3] * (size // 3) + [3] * (size % 3), index=[0] * size)
    )
    assert torch.equal(adv, torch.zeros(size))


@pytest.mark.parametrize(
    "index",
    [
        np.array(["x", "y", "x", "y"]),
        np.array([5, 9, 5, 9]),
        torch.tensor([5, 9, 5, 9]),
        [5, 9, 5, 9],
        np.array(["x", 2, "x", 2], dtype=object),
    ],
)
def test_group_id_forms_agree(index):
    adv = first_token("grpo", outcome([1.0, 0.0, 0.0, 1.0], index=index, norm_adv_by_std_in_grpo=False))
    assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5]))


def test_group_ids_are_contiguous_and_checked():
    assert as_group_ids(np.array(["b", "a", "b"]), num_samples=3).tolist() == [1, 0, 1]
    assert as_group_ids(torch.tensor([100, 7, 100]), num_samples=3).tolist() == [1, 0, 1]
    with pytest.raises(TypeError, match="integers or strings"):
        as_group_ids(torch.tensor([0.5, 1.5]), num_samples=2)
    with pytest.raises(ValueError, match="2 group ids for a batch of 3"):
        as_group_ids([0, 1], num_samples=3)


def test_missing_inputs_are_named():
    rewards, mask = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="AdvantageInputs.values"):
        compute_advantages(adv_estimator="gae", inputs=AdvantageInputs(token_level_rewards=rewards, response_mask=mask))
    with pytest.raises(ValueError, match="AdvantageInputs.index"):
        compute_advantages(
            adv_estimator="grpo", inputs=AdvantageInputs(token_level_rewards=rewards, response_mask=mask)
        )
    with pytest.raises(ValueError, match="AdvantageInputs.reward_baselines"):
        compute_advantages(
            adv_estimator="remax", inputs=AdvantageInputs(token_level_rewards=rewards, response_mask=mask)
        )


def test_unknown_estimator_lists_known():
    with pytest.raises(ValueError, match="Did you mean 'grpo'.*gae.*rloo") as info:
        ADV_ESTIMATORS.check("grop")
    assert "algorithm.adv_estimator" in str(info.value)


def test_no_grad_in_advantages():
    rewards = torch.tensor([[1.0, 0.0]], requires_grad=True)
    out = compute_advantages(
        adv_estimator="grpo",
        inputs=AdvantageInputs(token_level_rewards=rewards, response_mask=torch.ones(1, 2), index=[0]),
    )
    assert not out.advantages.requires_grad
