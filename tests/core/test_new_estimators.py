"""gdpo, optimal_token_baseline, tir_optimal_token_baseline, grpo_vectorized, rloo_vectorized against numbers
worked out by hand (formulas from verl's core_algos at 1dda039)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from npu_rl.core import ADV_ESTIMATORS, AdvantageInputs, compute_advantages

NEW = ("gdpo", "optimal_token_baseline", "tir_optimal_token_baseline", "grpo_vectorized", "rloo_vectorized")


def adv(name, rewards, mask=None, **kwargs):
    mask = torch.ones_like(rewards) if mask is None else mask
    inputs = AdvantageInputs(token_level_rewards=rewards, response_mask=mask, **kwargs)
    return compute_advantages(adv_estimator=name, inputs=inputs)


def test_registered():
    assert set(NEW) <= set(ADV_ESTIMATORS.names())


def test_grpo_vectorized_is_grpo():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(8, 5, generator=gen)
    mask = (torch.rand(8, 5, generator=gen) > 0.3).float()
    index = [0, 0, 0, 1, 1, 2, 3, 3]
    for norm in (True, False):
        a = adv("grpo", rewards, mask, index=index, norm_adv_by_std_in_grpo=norm)
        b = adv("grpo_vectorized", rewards, mask, index=index, norm_adv_by_std_in_grpo=norm)
        assert_close(a.advantages, b.advantages)


def test_rloo_vectorized_by_hand():
    # group a: scores [1, 0, 2], n = 3, mean 1 -> 3/2 (s - 1) = [0, -1.5, 1.5]
    # group b: a single sample of score 5 -> 0 (the loop version `rloo` keeps 5, as verl's does)
    rewards = torch.tensor([[1.0], [0.0], [2.0], [5.0]])
    index = ["a", "a", "a", "b"]
    out = adv("rloo_vectorized", rewards, index=index)
    assert_close(out.advantages, torch.tensor([[0.0], [-1.5], [1.5], [0.0]]))
    assert_close(adv("rloo", rewards, index=index).advantages[3], torch.tensor([5.0]))


# ---------------------------------------------------------------------------------------------------- gdpo


def test_gdpo_by_hand():
    # groups {0, 1} and {2, 3}; components c1 = [1, 0, 1, 1], c2 = [0, 2, 0, 1], weights (1, 2), eps 1e-6
    # c1: group 0 mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / (sqrt(0.5) + eps); group 1 is constant -> 0, 0
    # c2: group 0 mean 1, std sqrt(2) -> -+1 / (sqrt(2) + eps); group 1 [0, 1] -> -+0.5 / (sqrt(0.5) + eps)
    # sum = [a - 2b, -a + 2b, -2a, 2a] with a = 0.5 / (sqrt(0.5) + eps), b = 1 / (sqrt(2) + eps)  (~[-.71, .71,
    # -1.41, 1.41]); then whitened over the 4 tokens: mean 0, unbiased var = sum x^2 / 3
    eps = 1e-6
    a, b = 0.5 / (math.sqrt(0.5) + eps), 1.0 / (math.sqrt(2.0) + eps)
    raw = torch.tensor([a - 2 * b, -a + 2 * b, -2 * a, 2 * a], dtype=torch.float64)
    expected = raw / torch.sqrt((raw**2).sum() / 3 + 1e-8)
    comps = (torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0.0, 2.0, 0.0, 1.0]))
    out = adv(
        "gdpo",
        torch.zeros(4, 1, dtype=torch.float64),
        index=[0, 0, 1, 1],
        reward_components=comps,
        reward_weights=(1.0, 2.0),
    )
    assert_close(out.advantages[:, 0], expected)
    # ~[-sqrt(.3), sqrt(.3), -sqrt(1.2), sqrt(1.2)]
    assert_close(out.advantages[:, 0], torch.tensor([-0.3, 0.3, -1.2, 1.2], dtype=torch.float64).sign()
                 * torch.tensor([0.3, 0.3, 1.2, 1.2], dtype=torch.float64).sqrt(), atol=1e-5, rtol=0)


def test_gdpo_without_components_is_whitened_grpo():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 3.0], [0.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    index = [0, 0, 1, 1]
    grpo = adv("grpo", rewards, mask, index=index).advantages
    valid = mask.bool()
    centred = grpo[valid] - grpo[valid].mean()
    expected = torch.zeros_like(grpo)
    expected[valid] = centred / torch.sqrt(centred.square().sum() / (valid.sum() - 1) + 1e-8)
    assert_close(adv("gdpo", rewards, mask, index=index).advantages, expected)


def test_gdpo_weights_must_match_components():
    with pytest.raises(ValueError, match="2 reward weights for 1"):
        adv("gdpo", torch.zeros(2, 1), index=[0, 0], reward_components=(torch.zeros(2),), reward_weights=(1, 1))


# ------------------------------------------------------------------------------------ optimal token baseline

# two samples of one prompt, two tokens each. Sample 0: pi = 0.5, sum pi^2 = 0.5 -> w = 1 - 1 + 0.5 = 0.5 per
# token, W = [0.5, 1.0]; sample 1: pi = 0.25, sum pi^2 = 0.5 -> w = 1 - 0.5 + 0.5 = 1.0, W = [1, 2].
OLD = torch.log(torch.tensor([[0.5, 0.5], [0.25, 0.25]]))
SPI = torch.full((2, 2), 0.5)
REWARDS = torch.tensor([[0.0, 1.0], [0.0, 0.0]])  # reward-to-go G0 = [1, 1], G1 = [0, 0]


def otb(name, rewards=REWARDS, mask=None, old=OLD, spi=SPI, index=(0, 0), **kwargs):
    return adv(name, rewards, mask, index=list(index), old_logprobs=old, sum_pi_squared=spi, **kwargs)


def test_otb_by_hand():
    # B_0 = (1 * 0.5 + 0 * 1) / (0.5 + 1) = 1/3;  B_1 = (1 * 1 + 0 * 2) / (1 + 2) = 1/3
    out = otb("optimal_token_baseline")
    assert_close(out.advantages, torch.tensor([[2 / 3, 2 / 3], [-1 / 3, -1 / 3]]))
    assert_close(out.returns, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))


def test_otb_zero_tail():
    # sample 1 has one token: B_0 = 1/3 as above; at t = 1 only sample 0 is left (B_1 = 1), but it is the unique
    # longest sample, so its baseline past the second-longest length (1) is 0 -> A_0 = [1 - 1/3, 1 - 0]
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    out = otb("optimal_token_baseline", mask=mask)
    assert_close(out.advantages, torch.tensor([[2 / 3, 1.0], [-1 / 3, 0.0]]))


def test_otb_single_sample_group_keeps_its_return():
    out = otb("optimal_token_baseline", index=(0, 1))
    assert_close(out.advantages, out.returns)


def test_otb_rollout_is_weights_scale_the_path_variance():
    # rho = 0 on sample 1 removes it from the weighted mean: B_t = G0 = 1 -> A = [[0, 0], [-1, -1]]
    rho = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    out = otb("optimal_token_baseline", rollout_is_weights=rho)
    assert_close(out.advantages, torch.tensor([[0.0, 0.0], [-1.0, -1.0]]))


def test_otb_needs_sum_pi_squared():
    with pytest.raises(ValueError, match="sum_pi_squared"):
        otb("optimal_token_baseline", spi=None)


def test_tir_otb_lines_up_valid_tokens():
    # multi-turn: sample 0 generated tokens at columns 0 and 2 (column 1 is a tool observation), sample 1 at 0, 1.
    # Counted by valid token, this is the example of test_otb_by_hand: A0 = [2/3, 0, 2/3], A1 = [-1/3, -1/3, 0].
    # A third, empty sample of the same prompt is left out of the group (so N stays 2).
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    old = torch.log(torch.tensor([[0.5, 0.9, 0.5], [0.25, 0.25, 0.9], [0.5, 0.5, 0.5]]))
    spi = torch.full((3, 3), 0.5)
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    out = otb("tir_optimal_token_baseline", rewards, mask, old, spi, index=(0, 0, 0))
    assert_close(out.advantages, torch.tensor([[2 / 3, 0.0, 2 / 3], [-1 / 3, -1 / 3, 0.0], [0.0, 0.0, 0.0]]))
    # the column-wise estimator compares column 1 of sample 0 (masked) with sample 1's second token instead
    column_wise = otb("optimal_token_baseline", rewards, mask, old, spi, index=(0, 0, 0))
    assert not torch.allclose(column_wise.advantages, out.advantages)


def test_tir_otb_equals_otb_without_gaps():
    gen = torch.Generator().manual_seed(3)
    lengths = torch.tensor([5, 3, 5, 2, 4, 4])
    mask = (torch.arange(5) < lengths.unsqueeze(-1)).float()
    rewards = torch.rand(6, 5, generator=gen) * mask
    old = -torch.rand(6, 5, generator=gen)
    spi = torch.rand(6, 5, generator=gen)
    index = (0, 0, 0, 1, 1, 1)
    a = otb("optimal_token_baseline", rewards, mask, old, spi, index=index)
    b = otb("tir_optimal_token_baseline", rewards, mask, old, spi, index=index)
    assert_close(a.advantages, b.advantages)
    assert_close(a.returns, b.returns)
