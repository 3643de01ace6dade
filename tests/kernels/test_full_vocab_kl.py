"""Full-vocabulary KL(pi || pi_ref) from two models' hidden states, against the plain full-logits computation."""

from __future__ import annotations

import pytest
import torch

import npu_rl.kernels as K
from npu_rl.kernels.plain import naive_full_vocab_kl
from tests.kernels.conftest import ON_CPU
from tests.kernels.parity import make_problem, rel_err


def _run(fn, hidden, weight, ref_hidden, ref_weight, temperature, grad):
    hidden = hidden.detach().clone().requires_grad_()
    weight = weight.detach().clone().requires_grad_()
    kl = fn(hidden, weight, ref_hidden, ref_weight, temperature)
    (kl * grad).sum().backward()
    return kl.detach(), hidden.grad, weight.grad


def check_kl(backend, vocab, dtype, device, num_tokens, hidden_size, ref_hidden_size, temperature=0.9, **kwargs):
    hidden, weight, _ = make_problem(num_tokens, hidden_size, vocab, dtype, device, seed=0)
    ref_hidden, ref_weight, _ = make_problem(num_tokens, ref_hidden_size, vocab, dtype, device, seed=1)
    grad = torch.randn(num_tokens, generator=torch.Generator().manual_seed(2)).to(device)

    def fused(*args):
        return K.full_vocab_kl(*args, backend=backend, **kwargs)

    ours = _run(fused, hidden, weight, ref_hidden, ref_weight, temperature, grad)
    exact = _run(naive_full_vocab_kl, hidden.double(), weight.double(), ref_hidden.double(), ref_weight.double(),
                 temperature, grad.double())
    plain = _run(naive_full_vocab_kl, hidden, weight, ref_hidden, ref_weight, temperature, grad)
    for name, got, base, want in zip(("kl", "dhidden", "dweight"), ours, plain, exact):
        tol = 2e-5 if dtype == torch.float32 else max(2 * rel_err(base, want), 1e-3)
        assert rel_err(got, want) <= tol, f"{name}: relative error {rel_err(got, want):.2e} > {tol:.2e}"
        torch.testing.assert_close(got.double().cpu(), want.double().cpu(), rtol=10 * tol,
                                   atol=10 * tol * want.abs().max().item(), msg=lambda m: f"{name}: {m}")
    assert (ours[0] >= -1e-5).all(), "KL is never negative"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [151_936, 32_001, 49_152])
def test_torch_backend_matches_plain(vocab, dtype, device):
    # the reference model is narrower than the policy (hidden 24 vs 40): only the vocabulary must agree
    check_kl("torch", vocab, dtype, device, num_tokens=29, hidden_size=40, ref_hidden_size=24, chunk_size=8,
             vocab_chunk_size=20_000)


@pytest.mark.triton
@pytest.mark.parametrize(("backend", "vocab", "dtype"), [
    ("triton", 49_152, torch.float32),  # 151,936 columns: tests/e2e/test_kernels_full_vocab.py
    ("triton", 32_001, torch.bfloat16),
    ("triton_mm", 49_152, torch.bfloat16),
    ("triton_mm", 32_001, torch.float32),
])
def test_triton_matches_plain(backend, vocab, dtype, device, needs_triton):
    check_kl(backend, vocab, dtype, device, num_tokens=13 if ON_CPU else 129, hidden_size=32 if ON_CPU else 96,
             ref_hidden_size=16 if ON_CPU else 64, vocab_chunk_size=20_000)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.triton)])
def test_kl_to_itself_is_zero_with_zero_gradient(backend, device, request):
    if backend == "triton":
        request.getfixturevalue("needs_triton")
    hidden, weight, _ = make_problem(7, 16, 3001, torch.float32, device)
    hidden.requires_grad_()
    kl = K.full_vocab_kl(hidden, weight, hidden.detach(), weight, backend=backend)
    kl.sum().backward()
    torch.testing.assert_close(kl, torch.zeros_like(kl), rtol=0, atol=1e-6)
    torch.testing.assert_close(hidden.grad, torch.zeros_like(hidden), rtol=0, atol=1e-6)


def test_mismatched_vocabularies_are_refused(device):
    hidden, weight, _ = make_problem(3, 8, 100, torch.float32, device)
    with pytest.raises(ValueError, match="vocabulary"):
        K.full_vocab_kl(hidden, weight, hidden, weight[:99])
