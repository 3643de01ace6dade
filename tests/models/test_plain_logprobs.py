"""The plain (unfused) log-prob path of the swapped output layer: values and gradients against the textbook
``log_softmax(hidden @ W.T + b) / T`` at the target, and its float32 buffers of [tokens x vocabulary] (the padded
update with ``use_fused_kernels=False``, verl's default, spends its epilogue there: docs/benchmarks.md)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode

from npu_rl.models.forward import plain_linear_logprobs, plain_linear_sum_pi_squared, plain_linear_topk

N, H, V = 7, 16, 33  # a vocabulary that is no multiple of anything


def _inputs(dtype):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(N, H, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(V, H, generator=g) * 0.3).to(dtype).requires_grad_()
    bias = (torch.randn(V, generator=g) * 0.1).to(dtype).requires_grad_()
    targets = torch.randint(0, V, (N,), generator=g)
    return hidden, weight, bias, targets


def _reference(hidden, weight, bias, targets, temperature):
    temp = temperature.unsqueeze(-1) if isinstance(temperature, torch.Tensor) else temperature
    logprobs_all = torch.log_softmax(F.linear(hidden, weight, bias).float() / temp, dim=-1)  # [N, V]
    entropy = -(logprobs_all.exp() * logprobs_all).sum(-1)
    return logprobs_all.gather(-1, targets[:, None])[:, 0], entropy, logprobs_all


def _temperatures():
    return [1.0, 0.7, torch.linspace(0.5, 1.5, N)]


@pytest.mark.parametrize("temperature", _temperatures(), ids=["T=1", "T=0.7", "per-token"])
@pytest.mark.parametrize("chunk_rows", [3, 4096])
def test_logprobs_entropy_and_gradients_equal_the_log_softmax(temperature, chunk_rows):
    hidden, weight, bias, targets = _inputs(torch.float32)
    lp, ent = plain_linear_logprobs(hidden, weight, bias, targets, temperature, True, chunk_rows)
    want_lp, want_ent, _ = _reference(hidden, weight, bias, targets, temperature)
    assert_close(lp, want_lp)
    assert_close(ent, want_ent)
    grads = torch.autograd.grad((lp * torch.arange(N)).sum() + ent.sum(), (hidden, weight, bias))
    want = torch.autograd.grad((want_lp * torch.arange(N)).sum() + want_ent.sum(), (hidden, weight, bias))
    for got, expected in zip(grads, want):
        assert_close(got, expected)


@pytest.mark.parametrize("temperature", _temperatures(), ids=["T=1", "T=0.7", "per-token"])
def test_sum_pi_squared_and_topk_equal_the_log_softmax(temperature):
    hidden, weight, bias, targets = _inputs(torch.float32)
    _, _, full = _reference(hidden, weight, bias, targets, temperature)
    assert_close(plain_linear_sum_pi_squared(hidden, weight, bias, temperature, 3), full.exp().square().sum(-1))
    top_lp, top_ids = plain_linear_topk(hidden, weight, bias, temperature, 4, None, 3)
    want_lp, want_ids = torch.topk(full, 4, dim=-1)
    assert torch.equal(top_ids, want_ids)
    assert_close(top_lp, want_lp)
    grads = torch.autograd.grad(top_lp.sum(), (hidden, weight, bias))
    for got, expected in zip(grads, torch.autograd.grad(want_lp.sum(), (hidden, weight, bias))):
        assert_close(got, expected)


class VocabBuffers(TorchDispatchMode):
    """The ops that return a new [N, V] float32 tensor (in-place ops return their input: not counted)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(a) for a in args if isinstance(a, torch.Tensor)}
        if (isinstance(out, torch.Tensor) and out.shape == (N, V) and out.dtype == torch.float32
                and id(out) not in inputs):
            self.ops.append(str(func.overloadpacket))
        return out


@pytest.mark.parametrize("temperature, divisions", [(1.0, 0), (0.7, 1)])
def test_bf16_logits_take_one_float32_copy_and_no_division_at_temperature_one(temperature, divisions):
    # bf16 compute (the update's): the logits [N, V] are cast to float32 once; before, ``logits / T`` made a
    # second float32 [N, V] buffer in the forward, and a division by 1.0 ran forward and backward at T = 1
    hidden, weight, bias, targets = _inputs(torch.bfloat16)
    with VocabBuffers() as forward:
        lp, _ = plain_linear_logprobs(hidden, weight, bias, targets, temperature, False, 4096)
    assert forward.ops == ["aten._to_copy"]
    with VocabBuffers() as backward:
        lp.sum().backward()
    assert backward.ops.count("aten.div") == divisions  # d/dx (x / T) = grad / T; nothing at T = 1
    want_lp, _, _ = _reference(hidden.detach().float(), weight.detach().float(), bias.detach().float(), targets,
                               temperature)
    assert_close(lp, want_lp, rtol=0.02, atol=0.02)  # bf16 matmul
