"""KL estimators, straight-through variants, KL in the reward, KL loss and the controllers."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from npu_rl.core import (
    AdaptiveKLController,
    FixedKLController,
    check_kl_type,
    kl_in_reward,
    kl_loss,
    kl_penalty,
    make_kl_controller,
)

LN2 = math.log(2.0)
# d = logp - ref = [0, ln 2, -ln 2]
LOGP = torch.tensor([[0.0, LN2, -LN2]])
REF = torch.zeros(1, 3)


@pytest.mark.parametrize(
    "kl_type, expected",
    [
        ("kl", [0.0, LN2, -LN2]),
        ("k1", [0.0, LN2, -LN2]),
        ("abs", [0.0, LN2, LN2]),
        ("mse", [0.0, 0.5 * LN2**2, 0.5 * LN2**2]),
        ("k2", [0.0, 0.5 * LN2**2, 0.5 * LN2**2]),
        # exp(-d) + d - 1: d = ln 2 -> 0.5 + ln 2 - 1; d = -ln 2 -> 2 - ln 2 - 1
        ("low_var_kl", [0.0, LN2 - 0.5, 1.0 - LN2]),
        ("k3", [0.0, LN2 - 0.5, 1.0 - LN2]),
    ],
)
def test_estimators_by_hand(kl_type, expected):
    assert_close(kl_penalty(logprobs=LOGP, ref_logprobs=REF, kl_type=kl_type), torch.tensor([expected]))


def test_k3_clamps():
    # d = 5: e^-5 + 5 - 1 = 4.0067 (inside); d = -30: log-ratio 30 -> clamped to 20, e^20 - 21 -> clamped to 10;
    # d = +30: log-ratio -30 -> clamped to -20, e^-20 + 20 - 1 = 19 -> clamped to 10
    logp = torch.tensor([[5.0, -30.0, 30.0]])
    assert_close(
        kl_penalty(logprobs=logp, ref_logprobs=torch.zeros(1, 3), kl_type="k3"),
        torch.tensor([[math.exp(-5.0) + 4.0, 10.0, 10.0]]),
    )


@pytest.mark.parametrize("base", ["kl", "k1", "abs", "low_var_kl", "k3", "mse", "k2"])
def test_straight_through_value_of_base_gradient_of_k2(base):
    logp = torch.tensor([[0.3, -0.7, 1.1]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[0.1, 0.2, -0.4]], dtype=torch.float64)
    value = kl_penalty(logprobs=logp, ref_logprobs=ref, kl_type=base + "+")
    assert_close(value, kl_penalty(logprobs=logp, ref_logprobs=ref, kl_type=base))
    (grad,) = torch.autograd.grad(value.sum(), logp)
    (k2_grad,) = torch.autograd.grad(kl_penalty(logprobs=logp, ref_logprobs=ref, kl_type="k2").sum(), logp)
    assert_close(grad, k2_grad)
    assert_close(grad, (logp - ref).detach())  # d/dlogp of (logp - ref)^2 / 2


def test_full_kl_is_reserved():
    check_kl_type("full")  # valid in a config: computed in the model forward
    with pytest.raises(NotImplementedError, match="hidden states"):
        kl_penalty(logprobs=LOGP, ref_logprobs=REF, kl_type="full")
    with pytest.raises(ValueError, match="straight-through"):
        check_kl_type("full+")


@pytest.mark.parametrize("name", ["kl", "k3+", "low_var_kl", "mse+", "abs"])
def test_check_kl_type_accepts(name):
    check_kl_type(name)


def test_check_kl_type_lists_known():
    with pytest.raises(ValueError, match="Did you mean 'low_var_kl'.*abs, k1, k2, k3, kl, low_var_kl, mse"):
        check_kl_type("low_var_k")


def test_kl_in_reward_by_hand():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    old = torch.full((2, 3), -1.0)
    ref = torch.tensor([[-1.5, -1.0, -2.0], [-3.0, -3.0, -3.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])  # the second row entirely masked
    rewards, metrics = kl_in_reward(
        token_level_scores=scores, old_logprobs=old, ref_logprobs=ref, response_mask=mask, kl_coef=0.1, kl_type="kl"
    )
    # k1 = old - ref = [0.5, 0, 1] on row 0, masked to [0.5, 0, 0]; rewards = scores - 0.1 * kl
    assert_close(rewards, torch.tensor([[-0.05, 0.0, 1.0], [0.0, 0.0, 0.0]]))
    # per-sequence mean KL [0.25, 0 (empty row)], then the batch mean 0.125 (verl's convention)
    assert_close(metrics["reward_kl_penalty"], torch.tensor(0.125))
    assert_close(metrics["reward_kl_penalty_coeff"], torch.tensor(0.1))


def test_kl_loss_by_hand():
    logp = torch.tensor([[0.0, LN2], [-LN2, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]])
    out = kl_loss(logprobs=logp, ref_logprobs=torch.zeros(2, 2), response_mask=mask, kl_loss_coef=0.5, kl_type="k1")
    # token-mean of k1 over 3 tokens: (0 + ln2 - ln2) / 3 = 0; gradient 0.5 / 3 on each valid token
    assert_close(out.loss, torch.tensor(0.0))
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert_close(grad, torch.tensor([[0.5 / 3, 0.5 / 3], [0.5 / 3, 0.0]]))
    out = kl_loss(
        logprobs=logp,
        ref_logprobs=torch.zeros(2, 2),
        response_mask=mask,
        kl_loss_coef=0.5,
        kl_type="abs",
        loss_agg_mode="seq-mean-token-sum",
    )
    # abs: row sums ln 2 and ln 2, mean over 2 sequences ln 2, times 0.5
    assert_close(out.loss, torch.tensor(0.5 * LN2))
    assert_close(out.metrics["kl_loss"], torch.tensor(2 * LN2 / 3))


def test_adaptive_controller_by_hand():
    ctrl = AdaptiveKLController(kl_coef=0.1, target_kl=0.1, horizon=100)
    ctrl.update(current_kl=0.2, n_steps=10)  # error clip(0.2 / 0.1 - 1) = clip(1) = 0.2 -> x (1 + 0.2 * 10 / 100)
    assert ctrl.value == pytest.approx(0.1 * 1.02, rel=1e-12)
    ctrl.update(current_kl=0.1, n_steps=10)  # on target: unchanged
    assert ctrl.value == pytest.approx(0.102, rel=1e-12)
    ctrl.update(current_kl=0.05, n_steps=50)  # error -0.5 -> -0.2: x (1 - 0.2 * 50 / 100) = x 0.9
    assert ctrl.value == pytest.approx(0.102 * 0.9, rel=1e-12)
    ctrl.update(current_kl=torch.tensor(0.3), n_steps=100)  # a tensor works too (no .item()): x 1.2
    assert isinstance(ctrl.value, torch.Tensor)
    assert_close(ctrl.value, torch.tensor(0.102 * 0.9 * 1.2))


def test_fixed_controller_and_factory():
    fixed = make_kl_controller(type="fixed", kl_coef=0.001)
    fixed.update(current_kl=5.0, n_steps=100)
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.001
    adaptive = make_kl_controller(type="adaptive", kl_coef=0.2, target_kl=0.1, horizon=10)
    adaptive.update(current_kl=0.3, n_steps=1)
    restored = make_kl_controller(type="adaptive", kl_coef=0.2, target_kl=0.1, horizon=10)
    restored.load_state_dict(adaptive.state_dict())
    assert restored.value == adaptive.value == pytest.approx(0.2 * 1.02)
    with pytest.raises(ValueError, match="fixed, adaptive"):
        make_kl_controller(type="pid", kl_coef=0.1)
    with pytest.raises(ValueError, match="horizon"):
        make_kl_controller(type="adaptive", kl_coef=0.1, horizon=0)
