"""Fused linear -> log-prob + entropy against the plain torch computation (full logits, log_softmax).

Oracle: the plain computation in float64 on the same (dtype-rounded) inputs. In float32 we must agree with it to
float32 rounding; in bf16 we must be no less accurate than the plain computation run in bf16 (which rounds the
logits and their gradient to bf16 exactly as a model's lm_head would), within a factor 2. Vocabularies: Qwen2.5's
151,936 (a multiple of 128, not of 256), 32,001 (odd, Llama-2 + 1 token) and SmolLM2's 49,152; token counts odd.
"""

from __future__ import annotations

import pytest
import torch

import npu_rl.kernels as K
from npu_rl.kernels.plain import naive_logprob_entropy
from npu_rl.kernels.tiles import TileConfig
from tests.kernels.conftest import ON_CPU
from tests.kernels.parity import make_problem, rel_err

VOCABS = [151_936, 32_001, 49_152]
# Triton's CPU interpreter takes ~20 s for one 151,936-column case: those run in tests/e2e/test_kernels_full_vocab.py
TRITON_VOCABS = [32_001, 49_152]
FP32_TOL = 2e-5  # relative; float32 sums over up to 152k columns
NAMES = ("logprobs", "entropy", "dhidden", "dweight")


def _run(fn, hidden, weight, targets, temperature, g_lp, g_ent):
    """Values and the grads of sum(g_lp * logprobs + g_ent * entropy) w.r.t. hidden and weight."""
    hidden = hidden.detach().clone().requires_grad_()
    weight = weight.detach().clone().requires_grad_()
    logprobs, entropy = fn(hidden, weight, targets, temperature)
    ((logprobs * g_lp).sum() + (entropy * g_ent).sum()).backward()
    return logprobs.detach(), entropy.detach(), hidden.grad, weight.grad


def check_parity(backend, vocab, dtype, device, num_tokens, hidden_size, temperature=0.8, **kwargs):
    hidden, weight, targets = make_problem(num_tokens, hidden_size, vocab, dtype, device)
    gen = torch.Generator().manual_seed(1)
    g_lp, g_ent = (torch.randn(num_tokens, generator=gen).to(device) for _ in range(2))
    temp64 = temperature.double() if isinstance(temperature, torch.Tensor) else temperature

    def fused(h, w, t, temp):
        return K.linear_logprob_entropy(h, w, t, temp, backend=backend, **kwargs)

    ours = _run(fused, hidden, weight, targets, temperature, g_lp, g_ent)
    exact = _run(naive_logprob_entropy, hidden.double(), weight.double(), targets, temp64, g_lp.double(),
                 g_ent.double())
    plain = _run(naive_logprob_entropy, hidden, weight, targets, temperature, g_lp, g_ent)
    assert ours[0].dtype == ours[1].dtype == torch.float32
    assert ours[2].dtype == ours[3].dtype == dtype
    for name, got, base, want in zip(NAMES, ours, plain, exact):
        tol = FP32_TOL if dtype == torch.float32 else max(2 * rel_err(base, want), 1e-3)
        assert rel_err(got, want) <= tol, f"{name}: relative error {rel_err(got, want):.2e} > {tol:.2e}"
        # element-wise too, so that one wrong vocabulary row (a padding tile) cannot hide in the norm
        torch.testing.assert_close(got.double().cpu(), want.double().cpu(), rtol=10 * tol,
                                   atol=10 * tol * want.abs().max().item(), msg=lambda m: f"{name}: {m}")
    assert (ours[0] <= 0).all(), "a log-prob is positive (verl #2656)"
    return ours


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", VOCABS)
def test_torch_backend_matches_plain(vocab, dtype, device):
    # chunks that divide neither the 37 tokens nor any of the vocabularies
    check_parity("torch", vocab, dtype, device, num_tokens=37, hidden_size=48, chunk_size=16, vocab_chunk_size=20_000)


@pytest.mark.triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", TRITON_VOCABS)
def test_triton_fused_matches_plain(vocab, dtype, device, needs_triton):
    check_parity("triton", vocab, dtype, device, num_tokens=19 if ON_CPU else 257, hidden_size=32 if ON_CPU else 96)


@pytest.mark.triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [32_001])
def test_triton_mm_matches_plain(vocab, dtype, device, needs_triton):
    check_parity("triton_mm", vocab, dtype, device, num_tokens=19 if ON_CPU else 257,
                 hidden_size=32 if ON_CPU else 96, vocab_chunk_size=50_000)


@pytest.mark.triton
@pytest.mark.parametrize("backend", ["triton", "triton_mm"])
def test_triton_small_tiles_mask_every_edge(backend, device, needs_triton):
    # 1000 columns = 15 tiles of 64 + 40; 23 tokens = 16 + 7; hidden 40 = 16 + 16 + 8: every load is partial
    check_parity(backend, 1000, torch.float32, device, num_tokens=23, hidden_size=40,
                 tiles=TileConfig(16, 64, 16, 1, 4), vocab_chunk_size=300)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.triton)])
def test_per_token_temperature(backend, device, request):
    if backend == "triton":
        request.getfixturevalue("needs_triton")
    temperature = torch.linspace(0.5, 1.5, 21, device=device)
    check_parity(backend, 32_001, torch.float32, device, num_tokens=21, hidden_size=32, temperature=temperature)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.triton)])
def test_logprob_is_never_positive_when_the_target_is_in_the_last_partial_tile(backend, device, request):
    """verl #2656/#2899: the fused kernel returned positive log-probs when V was not a multiple of its block.

    Every target is the last id of a 1000-word vocabulary (the 40-column tail after 15 tiles of 64) and carries
    a logit 30 above the rest: a kernel that skips or mis-masks the tail gets logprob ~ +30 or NaN; a correct one
    gets a value within float32 rounding of 0 from below."""
    if backend == "triton":
        request.getfixturevalue("needs_triton")
    hidden, weight, _ = make_problem(9, 16, 1000, torch.float32, device)
    direction = hidden[0] / hidden[0].norm()
    hidden = direction + 0.01 * hidden  # [9, 16], each row ~ the unit direction
    weight[999] = 30.0 * direction
    targets = torch.full((9,), 999, device=device)
    kwargs = {"tiles": TileConfig(16, 64, 16, 1, 4)} if backend == "triton" else {"vocab_chunk_size": 64}
    logprobs, entropy = K.linear_logprob_entropy(hidden, weight, targets, backend=backend, **kwargs)
    want, _ = naive_logprob_entropy(hidden.double(), weight.double(), targets)
    assert (logprobs <= 0).all(), logprobs
    torch.testing.assert_close(logprobs.double(), want, rtol=0, atol=1e-6)
    assert (entropy >= -1e-6).all()


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.triton)])
def test_one_output_used_and_leading_dims(backend, device, request):
    """[B, T, H] inputs; a loss on the log-probs alone, then on the entropy alone, each matches the plain grads."""
    if backend == "triton":
        request.getfixturevalue("needs_triton")
    hidden, weight, targets = make_problem(2 * 11, 32, 3001, torch.float32, device)
    hidden, targets = hidden.view(2, 11, 32), targets.view(2, 11)
    temperature = torch.tensor([[0.7], [1.3]], device=device)  # per sequence, broadcast over tokens
    for pick in (0, 1):
        grads = []
        for fn in (lambda h, w: K.linear_logprob_entropy(h, w, targets, temperature, backend=backend),
                   lambda h, w: naive_logprob_entropy(h, w, targets, temperature)):
            h = hidden.clone().requires_grad_()
            w = weight.clone().requires_grad_()
            out = fn(h, w)[pick]
            assert out.shape == (2, 11)
            (out * torch.arange(22.0, device=device).view(2, 11)).sum().backward()
            grads.append((h.grad, w.grad))
        for got, want in zip(*grads):
            assert rel_err(got, want) < FP32_TOL


def test_no_grad_forward_and_weight_only_grad(device):
    hidden, weight, targets = make_problem(5, 16, 777, torch.float32, device)
    with torch.no_grad():
        logprobs, _ = K.linear_logprob_entropy(hidden, weight, targets, backend="torch")
    assert not logprobs.requires_grad
    weight.requires_grad_()
    logprobs, _ = K.linear_logprob_entropy(hidden, weight, targets, backend="torch")
    logprobs.sum().backward()
    assert weight.grad is not None and hidden.grad is None


def test_bad_inputs_are_refused(device):
    hidden, weight, targets = make_problem(5, 16, 100, torch.float32, device)
    with pytest.raises(ValueError, match="disagree"):
        K.linear_logprob_entropy(hidden, weight[:, :8], targets)
    with pytest.raises(TypeError, match="dtype"):
        K.linear_logprob_entropy(hidden, weight.double(), targets)
    with pytest.raises(ValueError, match="targets"):
        K.linear_logprob_entropy(hidden, weight, targets.float())
    with pytest.raises(ValueError, match="temperature"):
        K.linear_logprob_entropy(hidden, weight, targets, 0.0)
    with pytest.raises(ValueError, match="unknown kernel backend"):
        K.linear_logprob_entropy(hidden, weight, targets, backend="cuda")
