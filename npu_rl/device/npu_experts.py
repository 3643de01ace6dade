"""Mixture-of-experts layers on Ascend: transformers' ``grouped_mm`` experts implementation with torch_npu's grouped
matrix multiplications in place of ``torch._grouped_mm``.

Why: transformers 5 runs the experts of Qwen3-MoE, DeepSeek-V3, Mixtral ... as 3-D tensors through its
``ExpertsInterface``, and its ``grouped_mm`` implementation calls ``torch._grouped_mm``. torch_npu registers no NPU
kernel for ``_grouped_mm`` (read from the 2.14.0 wheel: docs/moe.md), so on an NPU tensor it falls to torch's
composite loop, one matmul per expert after a host sync. torch_npu's own grouped GEMMs are:

- ``npu_grouped_matmul(x: list, weight: list, *, group_list, split_item, group_type, group_list_type)``: with one
  ``x [S, K]``, one ``weight [E, K, N]``, ``group_type=0`` (groups along M, the rows), ``split_item=3`` (one output
  tensor) and ``group_list`` the cumulative row counts (``group_list_type=0``), returns ``[y]`` with
  ``y[rows of e] = x[rows of e] @ weight[e]``. Documented for inference; it has no autograd formula, so
  :class:`GroupedMatmul` supplies one.
- ``npu_grouped_matmul_add_(self [E, M, N] fp32, x [K, M], weight [K, N], group_list, *, transpose_x=True,
  transpose_weight=False, group_type=2)``: groups along K (the rows here), ``self[e] += x[rows of e]^T @
  weight[rows of e]``, in place, fp32 accumulation: exactly a weight gradient.

The backward of ``y = x @ W_e`` per group: ``dx = dy @ W_e^T`` (the same grouped matmul with the weight transposed)
and ``dW_e = x_e^T @ dy_e`` (``npu_grouped_matmul_add_`` into an fp32 zero tensor). Both ops and these arguments are
present, with these names, in torch_npu 2.7.1, 2.10.0.post4 and 2.14.0 (``npu_grouped_matmul_add_`` without
``group_list_type`` in 2.7.1, hence the cumulative counts everywhere; tests/device/test_npu_experts.py reads them from
the recorded wheel facts).

On an NPU :func:`install` registers :func:`npu_grouped_mm_experts_forward` under transformers' ``grouped_mm`` name
(the default it picks for MoE models, and the inner implementation of expert parallelism), so nothing else changes;
``NPU_RL_NPU_GROUPED_MM=0`` keeps transformers' own. NEVER RUN ON AN NPU: written against torch_npu's documented
API; tested on CPU with a stand-in torch_npu that computes what the documentation says, against transformers' eager
experts (values and gradients).
"""

from __future__ import annotations

import os

import torch

IMPLEMENTATION = "grouped_mm"  # the name transformers selects by default; replaced on an NPU
ENV = "NPU_RL_NPU_GROUPED_MM"


def on_npu(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "npu"


def _torch_npu():
    import torch_npu  # the NPU backend has imported it already

    return torch_npu


class GroupedMatmul(torch.autograd.Function):
    """``y [S, N]``: rows ``offsets[e-1]:offsets[e]`` of ``x [S, K]`` times ``weight[e]`` (``weight [E, K, N]``,
    any strides), through torch_npu; ``offsets`` the cumulative row counts ``[E]`` int64."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight, offsets)
        return _gmm(x, weight, offsets)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, offsets = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = _gmm(grad, weight.transpose(1, 2), offsets) if ctx.needs_input_grad[0] else None
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = weight.new_zeros(weight.shape, dtype=torch.float32)
            _torch_npu().npu_grouped_matmul_add_(grad_w, x, grad, offsets, transpose_x=True, transpose_weight=False,
                                                 group_type=2)
            grad_w = grad_w.to(weight.dtype)
        return grad_x, grad_w, None


def _gmm(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return _torch_npu().npu_grouped_matmul([x], [weight], group_list=offsets, split_item=3, group_type=0,
                                           group_list_type=0)[0]


def _grouped_linear(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor, bias: torch.Tensor | None,
                    is_transposed: bool) -> torch.Tensor:
    """transformers' ``_grouped_linear``: ``weight [E, in, out]`` when ``is_transposed``, else ``[E, out, in]``."""
    out = GroupedMatmul.apply(rows.to(weight.dtype), weight if is_transposed else weight.transpose(1, 2), offsets)
    return out + bias if bias is not None else out


def npu_grouped_mm_experts_forward(self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                                   top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' grouped experts (sort the (token, expert) pairs by expert, one grouped matmul per projection,
    weight, unsort, sum over k) with torch_npu's grouped matmuls. ``hidden_states [T, H]``, ``top_k_index [T, k]``,
    ``top_k_weights [T, k]``; returns ``[T, H]``. Falls back to transformers' own off an NPU tensor."""
    if not on_npu(hidden_states):
        from transformers.integrations.moe import grouped_mm_experts_forward

        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    num_tokens, num_top_k = top_k_index.shape
    expert_ids = top_k_index.reshape(-1)
    sorted_ids, order = torch.sort(expert_ids, stable=True)
    rows = hidden_states[order // num_top_k]  # [S, H]
    offsets = torch.cumsum(torch.bincount(expert_ids, minlength=self.num_experts), 0)  # int64, [E]
    has_bias = getattr(self, "has_bias", False)
    if getattr(self, "has_gate", True):
        weight, bias = self.gate_up_proj, (self.gate_up_proj_bias[sorted_ids] if has_bias else None)
    else:
        weight, bias = self.up_proj, (self.up_proj_bias[sorted_ids] if has_bias else None)
    transposed = bool(getattr(self, "is_transposed", False))
    projected = _grouped_linear(rows, weight, offsets, bias, transposed)
    projected = self._apply_gate(projected) if getattr(self, "has_gate", True) else self.act_fn(projected)
    bias = self.down_proj_bias[sorted_ids] if has_bias else None
    out = _grouped_linear(projected, self.down_proj, offsets, bias, transposed)  # [S, H]
    out = out * top_k_weights.reshape(-1)[order].unsqueeze(-1)
    pairs = torch.empty_like(out).index_copy(0, order, out)  # (token, k) order
    return pairs.view(num_tokens, num_top_k, -1).sum(dim=1).to(hidden_states.dtype)


def install() -> tuple[bool, str]:
    """On the NPU backend: the ``grouped_mm`` experts implementation becomes :func:`npu_grouped_mm_experts_forward`.
    Returns (installed, why not)."""
    if os.environ.get(ENV, "1") == "0":
        return False, f"{ENV}=0"
    # transformers is imported here, not at the head: the device layer loads before any model code
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(IMPLEMENTATION, npu_grouped_mm_experts_forward)
    return True, ""


def uninstall() -> None:
    from transformers.integrations.moe import ExpertsInterface, grouped_mm_experts_forward

    ExpertsInterface.register(IMPLEMENTATION, grouped_mm_experts_forward)
