"""Policy losses against numbers worked out by hand, gradcheck in float64, and edge cases."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from npu_rl.core import POLICY_LOSSES, compute_policy_loss
from tests.core.policy_inputs import policy_inputs

ALL = ("vanilla", "gspo", "clip_cov", "kl_cov", "gpg", "geo_mean", "cispo", "sapo", "dro", "dppo_tv", "dppo_kl")
METRICS = {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"}


def run(name, logprobs, old_logprobs, advantages, mask=None, **kwargs):
    logprobs = logprobs.clone().requires_grad_(True)
    mask = torch.ones_like(advantages) if mask is None else mask
    if name == "dro":
        kwargs.setdefault("dro_beta", 0.1)
    inputs = policy_inputs(
        old_logprobs=old_logprobs, logprobs=logprobs, advantages=advantages, response_mask=mask, **kwargs
    )
    out = compute_policy_loss(loss_mode=name, inputs=inputs)
    (grad,) = torch.autograd.grad(out.loss, logprobs, allow_unused=True)
    return out, grad


def test_registry_names():
    assert set(ALL) <= set(POLICY_LOSSES.names())


# -------------------------------------------------------------------------------------------------- vanilla


def test_vanilla_by_hand():
    # ratios [1.5, 0.5, 1, 4], A = [1, 1, -1, -1], clip 0.2 / 0.28, clip_ratio_c 3
    # t0: max(-1.5, -1.28) = -1.28 (clipped)      t1: max(-0.5, -0.8) = -0.5
    # t2: max(1, 1) = 1, min(1, 3) = 1            t3: max(4, 1.28) = 4, dual: min(4, 3) = 3 (dual-clipped)
    # token-mean: (-1.28 - 0.5 + 1 + 3) / 4 = 0.555
    ratios = torch.tensor([[1.5, 0.5, 1.0, 4.0]])
    old = torch.full((1, 4), -1.0)
    out, grad = run("vanilla", old + ratios.log(), old, torch.tensor([[1.0, 1.0, -1.0, -1.0]]), clip_ratio_high=0.28)
    assert_close(out.loss, torch.tensor(0.555))
    assert_close(out.metrics["pg_clipfrac"], torch.tensor(0.25))
    assert_close(out.metrics["pg_clipfrac_lower"], torch.tensor(0.25))
    # ppo_kl = mean(old - new) = -(log 1.5 + log 0.5 + 0 + log 4) / 4 = -log(3) / 4
    assert_close(out.metrics["ppo_kl"], torch.tensor(-math.log(3.0) / 4))
    # d/dlogp of -A r is -A r: t0 and t3 are clipped (no gradient); t1: -0.5 / 4; t2: 1 / 4
    assert_close(grad, torch.tensor([[0.0, -0.125, 0.25, 0.0]]))


def test_vanilla_clip_ratio_c_must_exceed_one():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        run("vanilla", torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), clip_ratio_c=1.0)


def test_vanilla_asymmetric_clip():
    # r = 1.25 with A > 0: clip-higher 0.28 leaves it alone, the symmetric 0.2 clips it to 1.2
    log_r = torch.full((1, 1), math.log(1.25))
    symmetric, _ = run("vanilla", log_r, torch.zeros(1, 1), torch.ones(1, 1))
    higher, _ = run("vanilla", log_r, torch.zeros(1, 1), torch.ones(1, 1), clip_ratio_high=0.28)
    assert_close(symmetric.loss, torch.tensor(-1.2))
    assert_close(higher.loss, torch.tensor(-1.25))
    # r = 0.75 with A < 0: low clip 0.2 -> -A * 0.8 = 0.8 beats 0.75
    low, _ = run("vanilla", torch.full((1, 1), math.log(0.75)), torch.zeros(1, 1), -torch.ones(1, 1))
    assert_close(low.loss, torch.tensor(0.8))


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("log_ratio", [60.0, -60.0])
def test_ratio_extremes_stay_finite(name, log_ratio):
    old = torch.full((2, 3), -1.0)
    adv = torch.tensor([[1.0, -1.0, 2.0], [-2.0, 1.0, -1.0]])
    out, grad = run(name, old + log_ratio, old, adv, clip_cov_lb=-1e9, clip_cov_ub=1e9)
    assert torch.isfinite(out.loss) and torch.isfinite(grad).all()
    assert all(torch.isfinite(v) for v in out.metrics.values())


def test_vanilla_dual_clip_caps_huge_ratios():
    # r = exp(20) after the clamp, A = -2: max(2 e^20, 2 * 1.2) capped by the dual clip at 2 * 3 = 6
    out, grad = run("vanilla", torch.full((1, 1), 100.0), torch.zeros(1, 1), torch.full((1, 1), -2.0))
    assert_close(out.loss, torch.tensor(6.0))
    assert_close(grad, torch.zeros(1, 1))


# ----------------------------------------------------------------------------------------------------- gspo


def test_gspo_by_hand():
    # row 0: log-ratios [0.1, 0.3] -> s = exp(0.2) = 1.2214 (inside [0.8, 1.28]); A = 1 -> -1.2214 per token
    # row 1: log-ratios [-0.5, -0.5] -> s = exp(-0.5) = 0.6065 < 0.8; A = -1 -> max(0.6065, 0.8) = 0.8 (clipped)
    # seq-mean-token-mean: (-1.2214 + 0.8) / 2
    old = torch.zeros(2, 2)
    new = torch.tensor([[0.1, 0.3], [-0.5, -0.5]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    out, grad = run("gspo", new, old, adv, clip_ratio_high=0.28)
    s = math.exp(0.2)
    assert_close(out.loss, torch.tensor((-s + 0.8) / 2))
    assert_close(out.metrics["pg_clipfrac"], torch.tensor(0.5))
    # each token of row 0 carries the sequence ratio's value: d/dlogp_t = -A s / (2 tokens) / (2 sequences)
    assert_close(grad, torch.tensor([[-s / 4, -s / 4], [0.0, 0.0]]))


def test_gspo_equals_vanilla_for_one_token_responses():
    # response length 1: the sequence ratio is the token ratio (positive advantages: no dual clip involved)
    old, new = torch.zeros(4, 1), torch.tensor([[0.1], [0.4], [-0.1], [-0.5]])
    adv = torch.tensor([[1.0], [0.5], [2.0], [1.5]])
    gspo, gspo_grad = run("gspo", new, old, adv)
    vanilla, vanilla_grad = run("vanilla", new, old, adv)
    assert_close(gspo.loss, vanilla.loss)
    assert_close(gspo_grad, vanilla_grad)


# -------------------------------------------------------------------------------------- clip_cov and kl_cov


# one row, A = [1, -1, 1, -1], logp = [-1, -2, -3, -4] (mean -2.5), ratio 1 everywhere (nothing PPO-clipped)
# covariance (A - 0)(logp + 2.5) = [1.5, -0.5, -0.5, 1.5]: tokens 0 and 3 lie in (lb 1, ub 5)
COV_ADV = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
COV_LOGP = torch.tensor([[-1.0, -2.0, -3.0, -4.0]])


def test_clip_cov_cuts_all_eligible_tokens_by_hand():
    # clip_cov_ratio 0.5 of 4 tokens = 2 to cut: both eligible ones. Per-token -A r = [-1, 1, -1, 1] -> [0, 1, -1, 0]
    out, grad = run("clip_cov", COV_LOGP, COV_LOGP, COV_ADV, clip_cov_ratio=0.5)
    assert_close(out.loss, torch.tensor(0.0))
    assert_close(out.metrics["pg_clipfrac"], torch.tensor(0.5))
    assert_close(grad, torch.tensor([[0.0, 0.25, -0.25, 0.0]]))


def test_clip_cov_cuts_a_random_one_of_two():
    torch.manual_seed(0)
    seen = set()
    for _ in range(20):  # floor(0.25 * 4) = 1 token cut, chosen at random among tokens 0 and 3
        out, grad = run("clip_cov", COV_LOGP, COV_LOGP, COV_ADV, clip_cov_ratio=0.25)
        assert_close(out.metrics["pg_clipfrac"], torch.tensor(0.25))
        cut = int((grad[0] == 0).nonzero()[0])
        seen.add(cut)
        # cutting token 0 leaves [0, 1, -1, 1] / 4 = 0.25; cutting token 3 leaves [-1, 1, -1, 0] / 4 = -0.25
        assert_close(out.loss, torch.tensor(0.25 if cut == 0 else -0.25))
    assert seen == {0, 3}


def test_clip_cov_nothing_eligible_is_ppo():
    old, new = torch.zeros(2, 3), torch.tensor([[0.1, 0.5, -0.3], [0.0, 0.2, -0.1]])
    adv = torch.tensor([[1.0, -1.0, 0.5], [-0.5, 1.0, 2.0]])
    clip_cov, grad_a = run("clip_cov", new, old, adv, clip_cov_lb=100.0, clip_cov_ub=200.0)
    vanilla, grad_b = run("vanilla", new, old, adv, clip_ratio_c=1e9)
    assert_close(clip_cov.loss, vanilla.loss)
    assert_close(grad_a, grad_b)


def test_kl_cov_by_hand():
    # logp = [-1, -2, -3, -5] (mean -2.75): covariance A (logp + 2.75) = [1.75, -0.75, -0.25, 2.25] -> top-1 is t3
    # old differs from new by 0.5 at t3 only: r3 = e^0.5; t3's loss -A r + 0.1 |0.5| = e^0.5 + 0.05
    # token-mean: (-1 + 1 - 1 + e^0.5 + 0.05) / 4
    logp = torch.tensor([[-1.0, -2.0, -3.0, -5.0]])
    old = logp - torch.tensor([[0.0, 0.0, 0.0, 0.5]])
    out, grad = run("kl_cov", logp, old, COV_ADV, kl_cov_ratio=0.25, ppo_kl_coef=0.1)
    assert_close(out.loss, torch.tensor((-1.0 + math.exp(0.5) + 0.05) / 4))
    # gradient: -A r per token, plus 0.1 * sign(0.5) at t3
    assert_close(grad, torch.tensor([[-1.0, 1.0, -1.0, math.exp(0.5) + 0.1]]) / 4)


# ------------------------------------------------------------------------------------ gpg, geo_mean, cispo


def test_gpg_by_hand():
    logp, adv = torch.tensor([[-1.0, -2.0]]), torch.tensor([[2.0, -1.0]])
    out, grad = run("gpg", logp, torch.zeros(1, 2), adv)
    # (-(2)(-1) - (-1)(-2)) / 2 = (2 - 2) / 2 = 0; gradient -A / 2
    assert_close(out.loss, torch.tensor(0.0))
    assert_close(grad, torch.tensor([[-1.0, 0.5]]))


def test_geo_mean_by_hand():
    # row 0: A = +1, log-ratios [0.1, 0.5] -> clipped to [0.1, 0.28] -> ratio exp(0.19), loss -exp(0.19)
    # row 1: A = -1, log-ratios [-0.5, 0.1] -> for A < 0 the larger of (lr, clamp(lr)) = [-0.2, 0.1]
    #        -> ratio exp(-0.05), loss +exp(-0.05)
    # mean over the 2 sequences
    new = torch.tensor([[0.1, 0.5], [-0.5, 0.1]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    out, grad = run("geo_mean", new, torch.zeros(2, 2), adv, clip_ratio_high=0.28)
    assert_close(out.loss, torch.tensor((-math.exp(0.19) + math.exp(-0.05)) / 2))
    assert_close(out.metrics["pg_clipfrac"], torch.tensor(0.25))  # token (0, 1), A > 0
    assert_close(out.metrics["pg_clipfrac_lower"], torch.tensor(0.25))  # token (1, 0), A < 0
    # d/dlogp(0,0) = -exp(0.19) * (1/2 tokens) * (1/2 sequences); (1,1): exp(-0.05) * 1/2 * 1/2
    assert_close(grad, torch.tensor([[-math.exp(0.19) / 4, 0.0], [0.0, math.exp(-0.05) / 4]]))


def test_cispo_by_hand():
    # ratios [1.5, 1.0], A = [1, 1]: weights sg[clip] = [1.28, 1.0]; loss -w A logp; gradient -w A / 2
    logp = torch.tensor([[-0.5, -2.0]])
    old = logp - torch.tensor([[math.log(1.5), 0.0]])
    out, grad = run("cispo", logp, old, torch.ones(1, 2), clip_ratio_high=0.28)
    assert_close(out.loss, torch.tensor(-(1.28 * -0.5 + 1.0 * -2.0) / 2))
    assert_close(grad, torch.tensor([[-0.64, -0.5]]))
    assert_close(out.metrics["pg_clipfrac"], torch.tensor(0.5))


# ------------------------------------------------------------------------------------------- common to all


def random_inputs(dtype=torch.float64, seed=0, batch=3, width=4):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, width, generator=gen, dtype=dtype) - 0.5
    new = old + 0.3 * torch.randn(batch, width, generator=gen, dtype=dtype)
    adv = torch.randn(batch, width, generator=gen, dtype=dtype)
    mask = torch.ones(batch, width, dtype=dtype)
    mask[0, 2:] = 0
    return old, new, adv, mask


# cispo is left out on purpose: its value is not its objective (sg[clip(r)] carries no gradient by design)
@pytest.mark.parametrize("name", [name for name in ALL if name not in ("cispo", "dppo_tv", "dppo_kl")])
def test_gradcheck(name):  # cispo and dppo: only the gradient is defined, not a value whose derivative it is
    old, new, adv, mask = random_inputs()
    if name == "gspo":  # GSPO's per-token gradient equals its value's only for sequence-level advantages
        adv = adv[:, :1].expand_as(adv).contiguous()
    kwargs = {"clip_cov_lb": 100.0, "clip_cov_ub": 200.0} if name == "clip_cov" else {}
    kwargs = {"dro_beta": 0.3} if name == "dro" else kwargs

    def loss_of(logprobs):
        inputs = policy_inputs(
            old_logprobs=old,
            logprobs=logprobs,
            advantages=adv,
            response_mask=mask,
            loss_agg_mode="token-mean",
            **kwargs,
        )
        return compute_policy_loss(loss_mode=name, inputs=inputs).loss

    assert torch.autograd.gradcheck(loss_of, (new.clone().requires_grad_(True),))


@pytest.mark.parametrize("name", ALL)
def test_metrics_are_detached_0d_tensors(name):
    old, new, adv, mask = random_inputs(torch.float32)
    out, _ = run(name, new, old, adv, mask)
    assert out.loss.dim() == 0
    assert set(out.metrics) == METRICS
    for value in out.metrics.values():
        assert isinstance(value, torch.Tensor) and value.dim() == 0 and not value.requires_grad


@pytest.mark.parametrize("name", ALL)
def test_masked_rows_get_no_gradient_and_no_nan(name):
    old, new, adv, mask = random_inputs(torch.float32)
    mask[1] = 0  # an all-masked row
    new[1] = float("nan")  # garbage there must not leak (padding can hold anything)
    out, grad = run(name, new, old, adv, mask)
    assert torch.isfinite(out.loss)
    assert_close(grad[1], torch.zeros(4))


@pytest.mark.parametrize("name", ALL)
def test_everything_masked_gives_zero(name):
    old, new, adv, mask = random_inputs(torch.float32)
    out, grad = run(name, new, old, adv, torch.zeros_like(mask))
    assert_close(out.loss, torch.tensor(0.0))
    assert_close(grad, torch.zeros_like(grad))


@pytest.mark.parametrize("name", ["vanilla", "gspo", "gpg", "cispo", "kl_cov", "sapo", "dppo_tv", "dppo_kl"])
def test_rollout_is_weights_scale_token_losses(name):
    old, new, adv, mask = random_inputs(torch.float64)
    plain, _ = run(name, new, old, adv, mask)
    doubled, _ = run(name, new, old, adv, mask, rollout_is_weights=torch.full_like(adv, 2.0))
    assert_close(doubled.loss, 2 * plain.loss)


def test_geo_mean_rollout_is_weights_use_geometric_mean():
    # weights 4 and 1 on one sequence: geometric mean 2 -> twice the loss
    new, adv = torch.tensor([[0.1, -0.1]]), torch.ones(1, 2)
    plain, _ = run("geo_mean", new, torch.zeros(1, 2), adv)
    weighted, _ = run("geo_mean", new, torch.zeros(1, 2), adv, rollout_is_weights=torch.tensor([[4.0, 1.0]]))
    assert_close(weighted.loss, 2 * plain.loss)


def test_unknown_loss_lists_known():
    with pytest.raises(ValueError, match="Did you mean 'gspo'.*cispo.*vanilla") as info:
        POLICY_LOSSES.check("gsp")
    assert "actor_rollout_ref.actor.policy_loss.loss_mode" in str(info.value)
