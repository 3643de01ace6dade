"""The MoE top-k combine (npu_rl.kernels.moe_combine): the Triton kernel (the interpreter on CPU) and the torch path
equal the plain gather, product and sum over k, in values and in the gradients of the rows and of the weights."""

from __future__ import annotations

import pytest
import torch

from npu_rl.kernels.moe_combine import topk_combine, topk_combine_torch, topk_combine_triton


def _routing(tokens: int, top_k: int, experts: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    expert_ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]).reshape(-1)
    _, perm = torch.sort(expert_ids, stable=True)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel())
    return perm, inverse, g


def _plain(y, inverse, weight, top_k):
    rows = y[inverse] if weight is None else y[inverse] * weight.unsqueeze(-1)
    return rows.view(-1, top_k, y.shape[-1]).sum(dim=1)


@pytest.mark.parametrize("hidden", [8, 96, 1100])  # one block, a masked block, two blocks with a tail
@pytest.mark.parametrize("weighted", [True, False])
def test_the_kernel_equals_the_plain_sum(needs_triton, device, hidden, weighted):
    tokens, top_k = 7, 3
    perm, inverse, g = _routing(tokens, top_k, 5, seed=hidden)
    y = torch.randn(tokens * top_k, hidden, generator=g).to(device)
    weight = torch.rand(tokens * top_k, generator=g).to(device) if weighted else None
    inverse = inverse.to(device)
    expected = _plain(y, inverse, weight, top_k)
    torch.testing.assert_close(topk_combine_triton(y, inverse, weight, top_k), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(topk_combine_torch(y, inverse, weight, top_k), expected, rtol=1e-6, atol=1e-6)


def test_bf16_rows_are_summed_in_fp32(needs_triton, device):
    """1 + 2^-8 + 2^-8: summed in bf16 each small term is a tie that rounds to 1; in fp32 the sum is 1 + 2^-7 exactly."""
    y = torch.tensor([[1.0], [2.0 ** -8], [2.0 ** -8]], dtype=torch.bfloat16, device=device)
    inverse = torch.arange(3, device=device)
    out = topk_combine_triton(y, inverse, None, 3)
    assert out.dtype == torch.bfloat16 and out.item() == 1.0 + 2.0 ** -7


def test_an_empty_batch_gives_an_empty_output(needs_triton, device):
    y = torch.empty(0, 16, device=device)
    index = torch.empty(0, dtype=torch.long, device=device)
    assert topk_combine_triton(y, index, None, 2).shape == (0, 16)


def test_the_ops_gradients_equal_autograd_through_the_plain_sum():
    tokens, top_k, hidden = 6, 2, 5
    perm, inverse, g = _routing(tokens, top_k, 4, seed=3)
    y = torch.randn(tokens * top_k, hidden, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.rand(tokens * top_k, generator=g, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(tokens, hidden, generator=g, dtype=torch.float64)
    out = topk_combine(y, perm, inverse, weight, top_k)
    grad_y, grad_w = torch.autograd.grad((out * upstream).sum(), (y, weight))
    expected = torch.autograd.grad((_plain(y, inverse, weight, top_k) * upstream).sum(), (y, weight))
    torch.testing.assert_close(out, _plain(y, inverse, weight, top_k).detach())
    torch.testing.assert_close(grad_y, expected[0])
    torch.testing.assert_close(grad_w, expected[1])
    assert torch.autograd.gradcheck(lambda a, b: topk_combine(a, perm, inverse, b, top_k), (y, weight))
