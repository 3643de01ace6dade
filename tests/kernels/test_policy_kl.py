"""Fused PPO policy loss + KL estimator: hand-worked values, and the Triton pass against the torch reference."""

from __future__ import annotations

import math

import pytest
import torch

import npu_rl.kernels as K
from npu_rl.kernels.policy_kl import policy_loss_and_kl_torch

BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.triton)]


def _backend(request, backend):
    if backend == "triton":
        request.getfixturevalue("needs_triton")
    return backend


@pytest.mark.parametrize("backend", BACKENDS)
def test_dual_clip_ppo_by_hand(backend, device, request):
    backend = _backend(request, backend)
    # clip 0.2 / 0.2, clip_ratio_c 3. Per token: ratio, advantage ->
    #   r=1.5 A=+1: pg1=-1.5, pg2=-1.2 -> max -1.2, clipped; gradient 0 (the clipped branch is constant)
    #   r=0.5 A=-1: pg1=0.5, pg2=0.8 -> 0.8 < pg3=3, clipped, not lower-clipped; gradient 0
    #   r=4.0 A=-1: pg1=4, pg2=1.2 -> 4 > pg3=3 -> 3, lower-clipped; gradient 0
    #   r=1.1 A=+2: pg1=pg2=-2.2 (inside the range) -> -2.2; d/dlogp = -A r = -2.2
    #   r=1.5 A=-1: pg1=1.5 > pg2=1.2 -> 1.5 < 3 -> 1.5; d/dlogp = -A r = 1.5
    #   r=e^25 A=+1: log-ratio clamped to 20; pg2=-1.2 wins; gradient 0
    ratios = torch.tensor([1.5, 0.5, 4.0, 1.1, 1.5, math.exp(25.0)], dtype=torch.float64)
    old = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.5, -30.0], dtype=torch.float64)
    logprobs = (old + ratios.log()).float().to(device).requires_grad_()
    advantages = torch.tensor([1.0, -1.0, -1.0, 2.0, -1.0, 1.0], device=device)
    out = K.policy_loss_and_kl(logprobs, old.float().to(device), advantages, backend=backend)
    expected = torch.tensor([-1.2, 0.8, 3.0, -2.2, 1.5, -1.2])
    torch.testing.assert_close(out.pg_losses.detach().cpu(), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.clipped.cpu(), torch.tensor([1.0, 1, 0, 0, 0, 1]))
    torch.testing.assert_close(out.clipped_lower.cpu(), torch.tensor([0.0, 0, 1, 0, 0, 0]))
    torch.testing.assert_close(out.log_ratio[-1].cpu(), torch.tensor(20.0))
    assert out.kl is None
    out.pg_losses.sum().backward()
    torch.testing.assert_close(logprobs.grad.cpu(), torch.tensor([0.0, 0, 0, -2.2, 1.5, 0]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kl_estimators_by_hand(backend, device, request):
    backend = _backend(request, backend)
    # d = logp - ref: 1, -0.5, -30 (k3's log-ratio 30 is clamped to 20 and its value to 10)
    logprobs = torch.tensor([-1.0, -2.5, -31.0], device=device)
    ref = torch.tensor([-2.0, -2.0, -1.0], device=device)
    zeros = torch.zeros(3, device=device)
    k3 = [math.exp(-1) + 1 - 1, math.exp(0.5) - 0.5 - 1, 10.0]
    cases = {"k1": [1.0, -0.5, -30.0], "abs": [1.0, 0.5, 30.0], "k2": [0.5, 0.125, 450.0], "low_var_kl": k3}
    # gradients: k1 1; abs sign(d); k2 d; k3 1 - exp(-d) unless clamped; '+': k2's, d
    grads = {"k1": [1.0, 1, 1], "abs": [1.0, -1, -1], "k2": [1.0, -0.5, -30], "low_var_kl": [1 - math.exp(-1),
                                                                                            1 - math.exp(0.5), 0]}
    for name, values in cases.items():
        for kl_type, grad in ((name, grads[name]), (name + "+", [1.0, -0.5, -30.0])):
            lp = logprobs.clone().requires_grad_()
            out = K.policy_loss_and_kl(lp, lp.detach(), zeros, ref, kl_type=kl_type, backend=backend)
            torch.testing.assert_close(out.kl.detach().cpu(), torch.tensor(values), rtol=1e-6, atol=1e-6)
            out.kl.sum().backward()
            torch.testing.assert_close(lp.grad.cpu(), torch.tensor(grad), rtol=1e-6, atol=1e-6,
                                       msg=lambda m, k=kl_type: f"{k}: {m}")
            value = K.kl_estimate(logprobs, ref, kl_type)  # the standalone estimator agrees
            torch.testing.assert_close(value.cpu(), torch.tensor(values), rtol=1e-6, atol=1e-6)


@pytest.mark.triton
@pytest.mark.parametrize("kl_type", ["k1", "abs", "mse", "low_var_kl", "k3+", "kl+"])
def test_triton_matches_torch_reference(kl_type, device, needs_triton):
    gen = torch.Generator().manual_seed(0)
    shape = (7, 301)  # 2107 tokens: two full blocks of 1024 and a partial one
    old = torch.randn(shape, generator=gen) - 2.0
    logprobs = old + 0.3 * torch.randn(shape, generator=gen)  # ratios both sides of the clip range
    logprobs[0, :5] = old[0, :5] + torch.tensor([25.0, -25.0, 0.0, math.log(1.2), math.log(0.8)])
    ref = logprobs + torch.randn(shape, generator=gen)
    ref[1, :2] = logprobs[1, :2] + torch.tensor([40.0, -40.0])  # k3's clamps
    advantages = torch.randn(shape, generator=gen)
    advantages[2, :3] = 0.0
    weights = torch.rand(shape, generator=gen)
    g_pg, g_kl = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    results = []
    for fn in (K.policy_loss_and_kl, policy_loss_and_kl_torch):
        lp = logprobs.to(device).requires_grad_()
        kwargs = dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, kl_type=kl_type,
                      weights=weights.to(device))
        if fn is K.policy_loss_and_kl:
            kwargs["backend"] = "triton"
        out = fn(lp, old.to(device), advantages.to(device), ref.to(device), **kwargs)
        ((out.pg_losses * g_pg.to(device)).sum() + (out.kl * g_kl.to(device)).sum()).backward()
        results.append((out.pg_losses, out.kl, out.clipped, out.clipped_lower, out.log_ratio, lp.grad))
    for got, want in zip(*results):
        torch.testing.assert_close(got.detach().cpu(), want.detach().cpu(), rtol=1e-5, atol=1e-6)


def test_bad_arguments_are_refused(device):
    x = torch.zeros(2, 3, device=device)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        K.policy_loss_and_kl(x, x, x, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="full_vocab_kl"):
        K.policy_loss_and_kl(x, x, x, x, kl_type="full")
    with pytest.raises(ValueError, match="unknown KL type"):
        K.kl_estimate(x, x, "k4")
    with pytest.raises(ValueError, match="equal shapes"):
        K.policy_loss_and_kl(x, x, x[:, :2])
