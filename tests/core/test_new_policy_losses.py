"""sapo, dro, dppo_tv, dppo_kl, GSPO's loss_agg_mode and the clip_cov / kl_cov token budget, against numbers worked
out by hand (formulas from verl's core_algos at 1dda039)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from npu_rl.core import POLICY_LOSSES, compute_policy_loss
from npu_rl.core.policy_loss import token_budget
from tests.core.policy_inputs import policy_inputs


def run(name, logprobs, old_logprobs, advantages, mask=None, **kwargs):
    logprobs = logprobs.clone().requires_grad_(True)
    mask = torch.ones_like(advantages) if mask is None else mask
    inputs = policy_inputs(
        old_logprobs=old_logprobs, logprobs=logprobs, advantages=advantages, response_mask=mask, **kwargs
    )
    out = compute_policy_loss(loss_mode=name, inputs=inputs)
    (grad,) = torch.autograd.grad(out.loss, logprobs)
    return out, grad


def test_registered():
    assert {"sapo", "dro", "dppo_tv", "dppo_kl"} <= set(POLICY_LOSSES.names())


# ---------------------------------------------------------------------------------------------------- sapo


def test_sapo_by_hand():
    # gate f(r) = sigmoid(tau (r - 1)) * 4 / tau; d f / d logp = 4 s (1 - s) r
    # row 0, token a: r = 1, A = 1 (tau 1): f = 0.5 * 4 = 2, loss -2, d/dlogp = -A * 4 * 0.25 * 1 = -1
    # row 0, token b: r = 1 + ln 3, A = 1: s = sigmoid(ln 3) = 0.75, f = 3, loss -3, d/dlogp = -4 * 0.1875 * r
    # row 1 (one valid token): r = 1, A = -1 (tau_neg 1.05): f = 2 / 1.05, loss +2 / 1.05, d/dlogp = +1
    # seq-mean-token-mean: ((-2 - 3) / 2 + 2 / 1.05) / 2; row 0 gradients / 2 tokens / 2 rows, row 1 / 1 / 2
    r_b = 1.0 + math.log(3.0)
    new = torch.tensor([[0.0, math.log(r_b)], [0.0, 5.0]])
    old = torch.zeros(2, 2)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    out, grad = run("sapo", new, old, adv, mask)
    assert_close(out.loss, torch.tensor((-2.5 + 2 / 1.05) / 2))
    assert_close(grad, torch.tensor([[-1 / 4, -0.75 * r_b / 4], [1 / 2, 0.0]]))
    assert_close(out.metrics["pg_clipfrac"], torch.tensor(0.0))


def test_sapo_is_always_seq_mean_token_mean_like_verl():
    new, old = torch.tensor([[0.1, 0.2, 0.0], [0.05, -0.1, 0.3]]), torch.zeros(2, 3)
    mask, adv = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]), torch.tensor([[1.0] * 3, [-0.5] * 3])
    a, _ = run("sapo", new, old, adv, mask, loss_agg_mode="token-mean")
    b, _ = run("sapo", new, old, adv, mask, loss_agg_mode="seq-mean-token-mean")
    assert_close(a.loss, b.loss)


# ----------------------------------------------------------------------------------------------------- dro


def test_dro_by_hand():
    # beta 0.5. token 0: logp -1, old -1.5 (log r 0.5), A 2: loss -(2 * -1 - 0.25 * 0.25) = 2.0625,
    #   d/dlogp = -(A - beta log r) = -(2 - 0.25) = -1.75
    # token 1: logp -2 = old, A -1: loss -(-1 * -2) = -2, d/dlogp = -A = 1
    # token-mean: (2.0625 - 2) / 2 = 0.03125, gradients / 2
    out, grad = run("dro", torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -2.0]]), torch.tensor([[2.0, -1.0]]),
                    dro_beta=0.5)
    assert_close(out.loss, torch.tensor(0.03125))
    assert_close(grad, torch.tensor([[-0.875, 0.5]]))
    assert_close(out.metrics["ppo_kl"], torch.tensor(-0.25))  # mean(old - new) = (-0.5 + 0) / 2


@pytest.mark.parametrize("beta", [None, 0.0, -1.0])
def test_dro_needs_a_positive_beta(beta):
    with pytest.raises(ValueError, match="dro_beta"):
        run("dro", torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), dro_beta=beta)


# ---------------------------------------------------------------------------------------------------- dppo

# sampled-token probabilities old -> new, advantages, thresholds eps_lo = eps_hi = 0.2, c = 3
# t0: 0.5 -> 0.6, A = 1:  p - p_old = 0.1 <= 0.2 -> kept; r = 1.2; loss -1.2 ln 0.6, d/dlogp = -1.2
# t1: 0.2 -> 0.5, A = 1:  0.3 > 0.2 -> dropped (loss 0, gradient 0)
# t2: 0.5 -> 0.2, A = -1: -0.3 < -0.2 -> dropped
# t3: 0.1 -> 0.4, A = -1: 0.3 >= -0.2 -> kept; r = 4 truncated to c = 3; loss 3 ln 0.4, d/dlogp = +3
OLD_P = torch.tensor([[0.5, 0.2, 0.5, 0.1]])
NEW_P = torch.tensor([[0.6, 0.5, 0.2, 0.4]])
DPPO_ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0]])


def test_dppo_tv_by_hand():
    out, grad = run("dppo_tv", NEW_P.log(), OLD_P.log(), DPPO_ADV)
    assert_close(out.loss, torch.tensor((-1.2 * math.log(0.6) + 3 * math.log(0.4)) / 4))
    assert_close(grad, torch.tensor([[-1.2 / 4, 0.0, 0.0, 3 / 4]]))
    assert_close(out.metrics["pg_clipfrac"], torch.tensor(0.5))  # t1, t2 outside the region
    assert_close(out.metrics["pg_clipfrac_lower"], torch.tensor(0.25))  # t3 kept with its ratio truncated


def test_dppo_kl_by_hand():
    # binary KL(p_old || p) = p_old ln(p_old / p) + (1 - p_old) ln((1 - p_old) / (1 - p)); thresholds 0.05
    # t0: 0.5 ln(5/6) + 0.5 ln(5/4) = 0.0204 <= 0.05 -> kept
    # t1: 0.2 ln 0.4 + 0.8 ln 1.6 = 0.1927 > 0.05 and p rose with A > 0 -> dropped
    # t2: 0.2231 > 0.05 and p fell with A < 0 -> dropped
    # t3: A < 0 and p rose (moving away from the penalised direction) -> kept whatever the KL
    # t4: 0.9 -> 0.99, A = 1: KL = 0.9 ln(0.9/0.99) + 0.1 ln 10 = 0.1445 > 0.05 -> dropped, though dppo_tv with
    #     threshold 0.2 keeps it (p - p_old = 0.09)
    old = torch.cat([OLD_P, torch.tensor([[0.9]])], dim=1)
    new = torch.cat([NEW_P, torch.tensor([[0.99]])], dim=1)
    adv = torch.cat([DPPO_ADV, torch.tensor([[1.0]])], dim=1)
    out, grad = run("dppo_kl", new.log(), old.log(), adv, clip_ratio_low=0.05, clip_ratio_high=0.05)
    assert_close(out.loss, torch.tensor((-1.2 * math.log(0.6) + 3 * math.log(0.4)) / 5))
    assert_close(grad, torch.tensor([[-1.2 / 5, 0.0, 0.0, 3 / 5, 0.0]]))
    _, tv_grad = run("dppo_tv", new.log(), old.log(), adv)
    assert tv_grad[0, 4] != 0


# ------------------------------------------------------------------------------------ gspo: loss_agg_mode


@pytest.mark.parametrize(
    "mode, expected",
    [
        # row 0: log-ratios [0.1, 0.3] -> s = e^0.2 (inside [0.8, 1.28]), A = 1 -> -s per token (2 tokens)
        # row 1: log-ratios 0 -> s = 1, A = -0.5 -> 0.5 per token (3 tokens)
        ("token-mean", lambda s: (-2 * s + 1.5) / 5),
        ("seq-mean-token-mean", lambda s: (-s + 0.5) / 2),  # the paper's objective
        ("token-sum", lambda s: -2 * s + 1.5),
        ("seq-mean-token-sum", lambda s: (-2 * s + 1.5) / 2),
    ],
)
def test_gspo_honours_loss_agg_mode(mode, expected):
    new = torch.tensor([[0.1, 0.3, 7.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-0.5, -0.5, -0.5]])
    out, _ = run("gspo", new, torch.zeros(2, 3), adv, mask, loss_agg_mode=mode, clip_ratio_high=0.28)
    assert_close(out.loss, torch.tensor(expected(math.exp(0.2))))


# -------------------------------------------------------------------------------- clip_cov / kl_cov budget


def test_token_budget_is_float64_like_verl():
    # verl: int(3e-4 * 10000) in Python floats = int(2.9999999999999996) = 2; float32 would round to 3
    assert float(torch.tensor(3e-4, dtype=torch.float32) * 10000) >= 3.0
    assert_close(token_budget(3e-4, torch.tensor(10000)), torch.tensor(2.0, dtype=torch.float64))
    assert_close(token_budget(2e-4, torch.tensor(100)), torch.tensor(1.0, dtype=torch.float64))  # at least 1


def test_kl_cov_penalises_two_of_10000_tokens():
    # every token has log r = 0.1; the penalty adds ppo_kl_coef * 0.1 on each selected token, so
    # (loss - loss without penalty) * N / (coef * 0.1) counts them: int(3e-4 * 10000) = 2
    gen = torch.Generator().manual_seed(0)
    n = 10000
    old = -torch.rand(1, n, generator=gen, dtype=torch.float64) - 0.5
    new = old + 0.1
    adv = torch.randn(1, n, generator=gen, dtype=torch.float64)
    out, _ = run("kl_cov", new, old, adv, kl_cov_ratio=3e-4, ppo_kl_coef=1.0)
    base = (-adv * math.exp(0.1)).mean()
    assert round(float((out.loss.detach() - base) * n / 0.1)) == 2
