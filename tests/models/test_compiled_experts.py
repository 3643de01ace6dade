"""Compiled MoE experts in training (``use_torch_compile``): the grouped matmul's custom ops equal a per-expert loop,
which modules compile, and what is left eager says why. The compiled models against eager ones (and no recompile
for another length) run in a fresh interpreter: tests/e2e/test_compiled_experts.py."""

from __future__ import annotations

import logging

import torch

from npu_rl.models.compiled_experts import (compile_experts, gather_rows, grouped_mm, grouped_mm_weight_grad,
                                           unsort_rows)
from npu_rl.workers.model_runner import compile_elementwise_blocks, is_compiled_block
from tests.models.moe_models import tiny_moe


def test_grouped_mm_ops_equal_a_loop_over_experts_with_an_empty_expert():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 5, generator=g, requires_grad=True)
    weight = torch.randn(3, 6, 5, generator=g).transpose(1, 2).requires_grad_()  # [E, K, N], not contiguous
    offsets = torch.tensor([2, 2, 7], dtype=torch.int32)  # expert 1 gets no row
    y = grouped_mm(x, weight, offsets)
    expected = torch.cat([x[:2] @ weight[0], x[2:] @ weight[2]])
    torch.testing.assert_close(y, expected)
    grad = torch.randn(7, 6, generator=g)
    y.backward(grad)
    torch.testing.assert_close(x.grad, torch.cat([grad[:2] @ weight[0].T, grad[2:] @ weight[2].T]))
    dw = torch.stack([x[:2].T @ grad[:2], torch.zeros(5, 6), x[2:].T @ grad[2:]]).detach()
    torch.testing.assert_close(weight.grad, dw)
    torch.testing.assert_close(grouped_mm_weight_grad(x.detach(), grad, offsets, 3), dw)


def test_a_transposed_parameters_weight_gradient_comes_in_the_parameters_layout():
    """transformers stores ``[E, out, in]`` and multiplies by its transpose: the op's gradient for that transposed
    view is itself a transposed view of an ``[E, out, in]`` tensor (so AccumulateGrad adds it to the parameter's
    gradient without a strided copy of the whole expert tensor) and equals a per-expert loop's; a contiguous
    ``[E, in, out]`` weight (``is_transposed``) gets the same sums, contiguous."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 4, generator=g)
    grad = torch.randn(9, 3, generator=g)
    offsets = torch.tensor([0, 5, 9], dtype=torch.int32)  # expert 0 gets no row
    expected = torch.stack([torch.zeros(4, 3), x[:5].T @ grad[:5], x[5:].T @ grad[5:]])
    out_in = torch.nn.Parameter(torch.randn(3, 3, 4, generator=g))  # [E, N, K]
    view = out_in.transpose(1, 2)
    (view_grad,) = torch.autograd.grad(grouped_mm(x, view, offsets), view, grad)
    assert view_grad.transpose(1, 2).is_contiguous() and not view_grad.is_contiguous()
    torch.testing.assert_close(view_grad, expected)
    in_out = torch.nn.Parameter(torch.randn(3, 4, 3, generator=g))  # [E, K, N]
    (in_out_grad,) = torch.autograd.grad(grouped_mm(x, in_out, offsets), in_out, grad)
    assert in_out_grad.is_contiguous()
    torch.testing.assert_close(in_out_grad, expected)


def test_gather_and_unsort_equal_plain_indexing_in_values_and_gradients():
    """The permutation's gather-only backwards against autograd through plain indexing (fp64, exact sums)."""
    g = torch.Generator().manual_seed(0)
    tokens, top_k, hidden = 5, 3, 4
    expert_ids = torch.randint(0, 4, (tokens * top_k,), generator=g)
    _, perm = torch.sort(expert_ids, stable=True)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel())
    x = torch.randn(tokens, hidden, generator=g, dtype=torch.float64, requires_grad=True)
    x_plain = x.detach().clone().requires_grad_()
    rows, rows_plain = gather_rows(x, perm, inverse, top_k), x_plain[perm // top_k]
    assert torch.equal(rows, rows_plain)
    scale = torch.randn(rows.shape, generator=g, dtype=torch.float64)
    out, out_plain = unsort_rows(rows * scale, perm, inverse), (rows_plain * scale)[inverse]
    assert torch.equal(out, out_plain)
    weight = torch.randn(out.shape, generator=g, dtype=torch.float64)
    (out.view(tokens, top_k, hidden).sum(1) ** 2 * weight[::top_k]).sum().backward()
    (out_plain.view(tokens, top_k, hidden).sum(1) ** 2 * weight[::top_k]).sum().backward()
    torch.testing.assert_close(x.grad, x_plain.grad, rtol=1e-12, atol=1e-12)


def test_expert_parallel_and_other_implementations_stay_eager_with_a_reason(caplog):
    model = tiny_moe("qwen3_moe")
    model.config._experts_implementation = "eager"
    with caplog.at_level(logging.INFO, logger="npu_rl.models.compiled_experts"):
        assert compile_experts(model) == 0
    assert "its experts implementation is 'eager'" in caplog.text
    model = tiny_moe("qwen3_moe")
    for module in model.modules():
        if hasattr(module, "gate_up_proj"):
            module._npu_rl_ep = object()  # what apply_expert_parallel leaves on a split module
    with caplog.at_level(logging.INFO, logger="npu_rl.models.compiled_experts"):
        assert compile_experts(model) == 0
    assert "expert parallelism's all-to-all" in caplog.text


def test_use_torch_compile_compiles_the_experts_and_the_shared_experts():
    model = tiny_moe("deepseek_v3")
    compiled = {name for name, m in model.named_modules() if is_compiled_block(m)}
    assert not compiled
    count = compile_elementwise_blocks(model)
    compiled = {name for name, m in model.named_modules() if is_compiled_block(m)}
    assert {"model.layers.1.mlp.experts", "model.layers.2.mlp.experts", "model.layers.1.mlp.shared_experts",
            "model.layers.0.mlp"} <= compiled and count == len(compiled)
    assert not any(name.endswith("gate") for name in compiled)  # routers stay eager (replay hooks them)


def test_experts_modules_of_transformers_5_17_without_its_expert_parallel_flag_are_found():
    """transformers 5.17 (the H200's) sets no ``_is_expert_parallel`` on experts modules: they must still compile
    (on the H200 they were silently left eager until this was fixed)."""
    model = tiny_moe("qwen3_moe")
    for module in model.modules():
        if hasattr(module, "_is_expert_parallel"):
            del module._is_expert_parallel
    assert compile_experts(model) == model.config.num_hidden_layers
