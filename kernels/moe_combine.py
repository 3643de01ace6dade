"""The top-k combine of a mixture-of-experts layer as one Triton kernel.

After the experts' matmuls, each token's ``k`` output rows sit in expert-sorted order; the layer's output is their
routing-weighted sum, ``out[t] = sum_i w[t*k + i] * y[inverse[t*k + i]]`` (``inverse``: slot to sorted row). The same
gather-and-sum over ``k`` (with no weights) is the backward of copying each token to its ``k`` sorted rows.

Compiled by inductor, that gather, product and sum over ``k`` ran at about a seventh of the H100's memory bandwidth
(``bench moe``'s profile, Qwen3-30B-A3B width, 65k tokens: 4.78 ms forward and 4.01 ms for the backward's
gather-sum, of a 40.9 ms layer). :func:`topk_combine` is one pass: a program per (token, block of columns) loads the
token's ``k`` slot indices and weights, reads the ``k`` rows once and writes the sum, accumulated in fp32. Measured
there (2026-12-07): the two combines 8.9 -> 1.6 ms, the layer 42.2 -> 35.1 ms (docs/benchmarks.md).

It is a custom op (:func:`topk_combine`, ``npu_rl::topk_combine``), opaque to the compiler, with a backward in plain torch ops that the
compiler fuses: ``grad_y[s] = w[perm[s]] * grad_out[perm[s] // k]`` and
``grad_w[j] = <grad_out[j // k], y[inverse[j]]>``. The Triton kernel runs for CUDA tensors when Triton is installed
(or CPU tensors under ``TRITON_INTERPRET=1``, for the tests); everything else, NPU tensors included (never run with
triton-ascend), takes :func:`topk_combine_torch`, the plain expression.
"""

from __future__ import annotations

import torch

from npu_rl.kernels._device import triton_available, triton_interpreted


def topk_combine_torch(y: torch.Tensor, inverse: torch.Tensor, weight: torch.Tensor | None,
                       top_k: int) -> torch.Tensor:
    """The plain expression: ``(y[inverse] * weight).view(T, k, H).sum(1)`` in fp32 (fp64 stays fp64), cast to
    ``y``'s dtype."""
    rows = y[inverse].to(_accumulation(y))
    if weight is not None:
        rows = rows * weight.to(rows.dtype).unsqueeze(-1)
    return rows.view(-1, top_k, y.shape[-1]).sum(dim=1).to(y.dtype)


def _accumulation(y: torch.Tensor) -> torch.dtype:
    return torch.promote_types(y.dtype, torch.float32)


_TRITON = triton_available()  # read once: dynamo would trace through the lru_cache at every compile


def uses_triton(y: torch.Tensor) -> bool:
    """Whether :func:`topk_combine` runs the Triton kernel for ``y``'s device."""
    if not _TRITON or y.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    return y.is_cuda or (y.device.type == "cpu" and triton_interpreted())


_KERNEL = None


def _kernel():
    """The Triton kernel, defined on first use (importing Triton costs a second)."""
    global _KERNEL
    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def _topk_combine_kernel(y_ptr, inverse_ptr, weight_ptr, out_ptr, hidden, stride_y, stride_out,
                                 TOP_K: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK_H: tl.constexpr):
            token = tl.program_id(0).to(tl.int64)
            cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
            mask = cols < hidden
            acc = tl.zeros([BLOCK_H], dtype=tl.float32)
            for i in tl.static_range(TOP_K):
                row = tl.load(inverse_ptr + token * TOP_K + i).to(tl.int64)
                values = tl.load(y_ptr + row * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
                if HAS_WEIGHT:
                    values = values * tl.load(weight_ptr + token * TOP_K + i).to(tl.float32)
                acc += values
            tl.store(out_ptr + token * stride_out + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)

        _KERNEL = (triton, _topk_combine_kernel)
    return _KERNEL


def topk_combine_triton(y: torch.Tensor, inverse: torch.Tensor, weight: torch.Tensor | None, top_k: int,
                        block: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """:func:`topk_combine_torch` as one Triton kernel (module docstring); ``block`` columns a program (a power of
    two; default up to 1024) and ``num_warps`` are for the bench (scripts/gpu/moe_combine_bench.py)."""
    triton, kernel = _kernel()
    slots, hidden = inverse.shape[0], y.shape[1]
    tokens = slots // top_k
    out = y.new_empty(tokens, hidden)
    if tokens == 0 or hidden == 0:
        return out.zero_()
    y = y if y.stride(1) == 1 else y.contiguous()
    inverse = inverse.contiguous()
    block = block or min(1024, triton.next_power_of_2(hidden))
    num_warps = num_warps or (4 if block >= 512 else 2)
    weight_arg = weight.contiguous() if weight is not None else inverse  # never read without HAS_WEIGHT
    kernel[(tokens, triton.cdiv(hidden, block))](
        y, inverse, weight_arg, out, hidden, y.stride(0), out.stride(0),
        TOP_K=top_k, HAS_WEIGHT=weight is not None, BLOCK_H=block, num_warps=num_warps)
    return out


@torch.library.custom_op("npu_rl::topk_combine", mutates_args=())
def topk_combine(y: torch.Tensor, perm: torch.Tensor, inverse: torch.Tensor, weight: torch.Tensor | None,
                 top_k: int) -> torch.Tensor:
    """``out [T, H]``: ``sum_i weight[t*k + i] * y[inverse[t*k + i]]`` (``weight`` None: 1). ``y [T*k, H]`` in
    expert-sorted order, ``perm`` the sort (sorted row to slot) and ``inverse`` its inverse, ``weight [T*k]`` in slot
    order. Differentiable in ``y`` and ``weight``."""
    if uses_triton(y):
        return topk_combine_triton(y, inverse, weight, top_k)
    return topk_combine_torch(y, inverse, weight, top_k)


@topk_combine.register_fake
def _topk_combine_shape(y, perm, inverse, weight, top_k):
    return y.new_empty(inverse.shape[0] // top_k, y.shape[1])


def _setup_context(ctx, inputs, output) -> None:
    y, perm, inverse, weight, top_k = inputs
    ctx.save_for_backward(y, perm, inverse, weight)
    ctx.top_k = top_k


def _backward(ctx, grad: torch.Tensor):
    y, perm, inverse, weight = ctx.saved_tensors
    grad_rows = grad[perm // ctx.top_k]  # each sorted row's token's gradient
    grad_y = grad_weight = None
    if ctx.needs_input_grad[0]:
        grad_y = grad_rows if weight is None else (
            grad_rows.to(_accumulation(y)) * weight[perm].to(_accumulation(y)).unsqueeze(-1)).to(y.dtype)
    if weight is not None and ctx.needs_input_grad[3]:
        grad_weight = (grad_rows.to(_accumulation(y)) * y.to(_accumulation(y))).sum(dim=-1)[inverse].to(weight.dtype)
    return grad_y, None, None, grad_weight, None


topk_combine.register_autograd(_backward, setup_context=_setup_context)

