"""Mixture-of-experts experts under ``torch.compile`` in training (``actor.use_torch_compile``): one graph per experts
module for every batch length, no graph break per expert.

Why not compile transformers' ``grouped_mm`` experts as they are: under ``torch.compile`` transformers calls
``torch._grouped_mm`` only for bf16 weights, and its fallback custom op (``transformers::grouped_mm_fallback``)
computes its backward with ``offs.tolist()``, which the compiled backward cannot trace (inductor: "failed with
aten._local_scalar_dense", a graph break). On CPU (torch 2.13) ``torch._grouped_mm`` itself does not compile: its
fake implementation accepts bf16 only, and bf16 failed with "Invalid strides/sizes" (measured 2026-12-03).

So the grouped matmul and its weight gradient are two opaque custom ops here (:func:`grouped_mm`,
:func:`grouped_mm_weight_grad`): the compiler sees their shapes (the rows ``S = tokens x top_k`` and the experts)
and never their data-dependent expert counts, which live in the ``offsets`` tensor. Inside, each calls
``torch._grouped_mm`` where it runs (CUDA bf16, CPU) and else one matmul per expert. Around them the compiled graph
holds the routing bookkeeping (sort by expert, gather, counts by ``scatter_add`` into a fixed ``[E]``, the gate's
activation and product, the routing weights, the unsort and the sum over ``k``), with the token count symbolic
(``dynamic=True``), so a batch of another length reuses the graph. The two permutations (tokens to their
expert-sorted slots, and back) are autograd functions whose backwards are gathers through the inverse permutation
(:func:`gather_rows`, :func:`unsort_rows`), not the scatter-adds that indexing's backward makes. Where Triton runs
(CUDA), the routing-weighted sum over ``k`` and the gather-and-sum of the copy's backward are one kernel each
(:mod:`npu_rl.kernels.moe_combine`): compiled by inductor they ran at a seventh of the memory bandwidth.

:func:`compile_experts` switches every experts module of transformers' experts interface that runs ``grouped_mm``
(the default) to :func:`compiled_experts_forward` and compiles it in place (``nn.Module.compile``; names and state
dicts unchanged). The routers stay eager: router replay and the load metrics hook them
(:mod:`npu_rl.models.moe`). Left eager, with the reason logged: expert-parallel modules (their all-to-all needs host
split sizes) and modules set to another implementation (``eager``, ``batched_mm``).
"""

from __future__ import annotations

import logging
import os
import types

import torch
from torch import nn

from npu_rl.device.grouped_mm import torch_grouped_mm_runs
from npu_rl.kernels.moe_combine import topk_combine, uses_triton
from npu_rl.parallel.expert_parallel import is_experts_module

log = logging.getLogger(__name__)


@torch.library.custom_op("npu_rl::grouped_mm", mutates_args=())
def grouped_mm(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``y [S, N]``: rows ``offsets[e-1]:offsets[e]`` of ``x [S, K]`` times ``weight[e]`` (``weight [E, K, N]``, any
    strides; ``offsets`` the cumulative row counts, int32 ``[E]``, ``offsets[-1] == S``: every row is routed)."""
    if torch_grouped_mm_runs(x, weight):
        return torch._grouped_mm(x, weight, offs=offsets)
    out = x.new_zeros(x.shape[0], weight.shape[2])
    start = 0
    for expert, end in enumerate(offsets.tolist()):
        if end > start:
            torch.mm(x[start:end], weight[expert], out=out[start:end])
        start = end
    return out


@grouped_mm.register_fake
def _grouped_mm_shape(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[2])


@torch.library.custom_op("npu_rl::grouped_mm_weight_grad", mutates_args=())
def grouped_mm_weight_grad(x: torch.Tensor, grad: torch.Tensor, offsets: torch.Tensor,
                           num_experts: int) -> torch.Tensor:
    """``dW [E, K, N]``: ``x[rows of e]^T @ grad[rows of e]`` (zero for an expert with no row)."""
    if torch_grouped_mm_runs(x, grad) and x.shape[0]:
        return torch._grouped_mm(x.t(), grad, offs=offsets)
    out = x.new_zeros(num_experts, x.shape[1], grad.shape[1])
    start = 0
    for expert, end in enumerate(offsets.tolist()):
        if end > start:
            torch.mm(x[start:end].t(), grad[start:end], out=out[expert])
        start = end
    return out


@grouped_mm_weight_grad.register_fake
def _weight_grad_shape(x: torch.Tensor, grad: torch.Tensor, offsets: torch.Tensor, num_experts: int) -> torch.Tensor:
    return x.new_empty(num_experts, x.shape[1], grad.shape[1])


def _setup_context(ctx, inputs, output) -> None:
    x, weight, offsets = inputs
    ctx.save_for_backward(x, weight, offsets)


def _backward(ctx, grad: torch.Tensor):
    x, weight, offsets = ctx.saved_tensors
    grad = grad.contiguous()
    grad_x = grouped_mm(grad, weight.transpose(1, 2), offsets) if ctx.needs_input_grad[0] else None
    grad_w = None
    if ctx.needs_input_grad[1]:
        if weight.dim() == 3 and weight.transpose(1, 2).is_contiguous() and not weight.is_contiguous():
            # a transposed view of an [E, N, K] parameter (transformers' layout): its gradient computed as
            # ``grad^T @ x`` lands in the parameter's own layout, so accumulating it is a plain add, not a strided
            # copy of the whole expert tensor (measured on the H200: a quarter of the layer's backward)
            grad_w = grouped_mm_weight_grad(grad, x, offsets, weight.shape[0]).transpose(1, 2)
        else:
            grad_w = grouped_mm_weight_grad(x, grad, offsets, weight.shape[0])
    return grad_x, grad_w, None


grouped_mm.register_autograd(_backward, setup_context=_setup_context)


def _linear(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor, bias: torch.Tensor | None,
            is_transposed: bool) -> torch.Tensor:
    """transformers' ``_grouped_linear``: ``weight [E, in, out]`` when ``is_transposed``, else ``[E, out, in]``."""
    out = grouped_mm(rows.to(weight.dtype), weight if is_transposed else weight.transpose(-2, -1), offsets)
    return out + bias if bias is not None else out


class _GatherRows(torch.autograd.Function):
    """``x[perm // k]`` (each of ``T`` tokens copied to its ``k`` sorted slots) whose backward is a gather and a sum
    over ``k`` (``grad[inverse].view(T, k, H).sum(1)``) instead of the indexing backward's scatter-add into ``x``:
    ``perm`` is a permutation of ``T x k`` slots, so slot ``t x k + i`` sits at ``inverse[t x k + i]``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, perm: torch.Tensor, inverse: torch.Tensor, top_k: int) -> torch.Tensor:
        ctx.save_for_backward(inverse)
        ctx.top_k = top_k
        return x[perm // top_k]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (inverse,) = ctx.saved_tensors
        if combine_kernel(grad):
            # ``perm`` is read only by the kernel's backward, which a backward never takes: ``inverse`` stands in
            return topk_combine(grad, inverse, inverse, None, ctx.top_k), None, None, None
        return grad[inverse].view(-1, ctx.top_k, grad.shape[-1]).sum(dim=1), None, None, None


class _Unsort(torch.autograd.Function):
    """``y[inverse]`` (the sorted slots back in token order) whose backward is the gather ``grad[perm]`` instead of a
    scatter-add: ``inverse`` is ``perm``'s inverse permutation."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, perm: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(perm)
        return y[inverse]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (perm,) = ctx.saved_tensors
        return grad[perm], None, None


def combine_kernel(rows: torch.Tensor) -> bool:
    """Whether the gather-and-sum over ``k`` runs as :func:`npu_rl.kernels.moe_combine.topk_combine` (one Triton
    kernel; where Triton runs for ``rows``' device) rather than as torch ops the compiler fuses.
    ``NPU_RL_MOE_COMBINE=compiler`` keeps the compiler's (read when the graph is traced)."""
    choice = os.environ.get("NPU_RL_MOE_COMBINE", "auto")
    if choice not in ("auto", "compiler"):
        raise ValueError(f"NPU_RL_MOE_COMBINE={choice!r}: expected auto (the Triton kernel where Triton runs) or "
                         "compiler (torch ops fused by the compiler)")
    return choice == "auto" and uses_triton(rows)


def gather_rows(x: torch.Tensor, perm: torch.Tensor, inverse: torch.Tensor, top_k: int) -> torch.Tensor:
    """``x [T, H]`` to its ``T x top_k`` expert-sorted rows ``x[perm // top_k]`` (:class:`_GatherRows`)."""
    return _GatherRows.apply(x, perm, inverse, top_k)


def unsort_rows(y: torch.Tensor, perm: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """``y [T x k, H]`` in expert order back to slot order, ``y[inverse]`` (:class:`_Unsort`)."""
    return _Unsort.apply(y, perm, inverse)


def compiled_experts_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                             top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' ``grouped_mm_experts_forward`` (same order of operations, so eager results are equal) with the
    grouped matmuls as :func:`grouped_mm` and the per-expert counts by ``scatter_add`` into ``[num_experts]`` (a
    static shape, where ``bincount``'s depends on the data). ``hidden_states [T, H]``, ``top_k_index [T, k]``,
    ``top_k_weights [T, k]``; returns ``[T, H]``."""
    num_tokens, num_top_k = top_k_index.shape
    sample_weights = top_k_weights.reshape(-1)
    expert_ids = top_k_index.reshape(-1)
    expert_ids_g, perm = torch.sort(expert_ids)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.size(0), device=perm.device)
    rows = gather_rows(hidden_states, perm, inverse, num_top_k)
    weights_g = sample_weights[perm]
    counts = torch.zeros(self.num_experts, dtype=torch.int32, device=expert_ids.device).scatter_add_(
        0, expert_ids, torch.ones_like(expert_ids, dtype=torch.int32))
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    has_bias, transposed = getattr(self, "has_bias", False), bool(getattr(self, "is_transposed", False))
    if getattr(self, "has_gate", True):
        weight, bias = self.gate_up_proj, (self.gate_up_proj_bias[expert_ids_g] if has_bias else None)
        projected = self._apply_gate(_linear(rows, weight, offsets, bias, transposed))
    else:
        weight, bias = self.up_proj, (self.up_proj_bias[expert_ids_g] if has_bias else None)
        projected = self.act_fn(_linear(rows, weight, offsets, bias, transposed))
    bias = self.down_proj_bias[expert_ids_g] if has_bias else None
    out = _linear(projected, self.down_proj, offsets, bias, transposed)
    if combine_kernel(out):
        return topk_combine(out, perm, inverse, sample_weights, num_top_k).to(hidden_states.dtype)
    weighted = unsort_rows(out * weights_g.unsqueeze(-1), perm, inverse)
    return weighted.view(num_tokens, num_top_k, -1).sum(dim=1).to(hidden_states.dtype)


def compile_experts(model: nn.Module) -> int:
    """Compile every eligible experts module of ``model`` in place (module docstring); returns how many."""
    count = 0
    for name, module in model.named_modules():
        if not is_experts_module(module):
            continue
        implementation = getattr(module.config, "_experts_implementation", None)
        if getattr(module, "_npu_rl_ep", None) is not None:
            log.info("%s stays eager under use_torch_compile: expert parallelism's all-to-all needs host split sizes",
                     name)
            continue
        if implementation != "grouped_mm":
            log.info("%s stays eager under use_torch_compile: its experts implementation is %r (compiled: grouped_mm)",
                     name, implementation)
            continue
        module.forward = types.MethodType(compiled_experts_forward, module)
        module.compile(dynamic=True)
        count += 1
    return count
