"""Variable-length ("packed") attention for HF models, with Ulysses when a sequence-parallel group is active.

:func:`use_varlen_attention` registers one attention implementation, ``npu_rl_varlen``, through transformers'
``AttentionInterface`` (and a matching ``AttentionMaskInterface`` entry) and selects it on the model. It has two
modes:

- inside ``with varlen_attention(layout):`` the model's input is one packed sequence ``[1, total]`` (or this rank's
  slice of it under Ulysses); attention is causal *within* each segment of ``layout.cu_seqlens`` and HF builds no
  mask at all (no ``[total, total]`` tensor);
- outside it, the model behaves exactly like ``sdpa`` (padded batches, ``generate``), so one model object serves
  both the packed training forward and ordinary use.

Kernels (``q, k, v: [total, heads, head_dim]``, GQA allowed):

- accelerators: transformers' flash-attention varlen function (``flash_attn_varlen_func``; on Ascend transformers
  maps it to ``npu_fusion_attention`` with the ``TND`` layout and ``actual_seq_qlen``), when transformers reports
  one available. Not run on hardware here.
- otherwise (CPU, or no flash kernel): :func:`sdpa_varlen`, ``scaled_dot_product_attention`` per segment with
  ``is_causal`` - exact, ``O(sum L_i^2)``, no block mask materialised.
- a device-layer hook wins over both: a ``varlen_attention`` attribute on the backend object, same signature.
"""

from __future__ import annotations

import functools
import logging
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from npu_rl.parallel.ulysses import heads_from_sequence, kv_repeat_factor, sequence_from_heads

logger = logging.getLogger(__name__)

ATTN_IMPLEMENTATION = "npu_rl_varlen"

# kernel(q, k, v, *, cu_seqlens, seqlens, max_seqlen, scale, dropout) -> [total, heads, head_dim]
VarlenKernel = Callable[..., torch.Tensor]


@dataclass
class VarlenLayout:
    """The packed layout of one forward, over the *full* sequence (sp padding included)."""

    cu_seqlens: torch.Tensor  # [num_segments + 1] int32, on the model's device
    seqlens: list[int]  # host copy (kernels that take host lengths; the reference loop)
    max_seqlen: int
    sp_group: dist.ProcessGroup | None = None
    kernel: VarlenKernel | None = None  # None: select_varlen_kernel()


_ACTIVE: ContextVar[VarlenLayout | None] = ContextVar("npu_rl_varlen_layout", default=None)
# The model-forward keyword that carries the layout to every attention call. A context variable alone is not enough:
# with gradient checkpointing the layers run again during backward, outside the forward's context, and must see the
# same layout (they get the same keyword arguments back).
LAYOUT_KWARG = "npu_rl_varlen_layout"
_OVERRIDE: list[VarlenKernel | None] = [None]


@contextmanager
def varlen_attention(layout: VarlenLayout):
    """Run models set to ``npu_rl_varlen`` in packed mode with ``layout`` inside the block."""
    if layout.kernel is None:
        layout.kernel = select_varlen_kernel()
    token = _ACTIVE.set(layout)
    try:
        yield layout
    finally:
        _ACTIVE.reset(token)


def sdpa_varlen(q, k, v, *, cu_seqlens, seqlens, max_seqlen, scale, dropout=0.0) -> torch.Tensor:
    """Reference kernel: causal SDPA on each segment. ``q: [T, H, D]``, ``k, v: [T, KV, D]``."""
    outputs, start = [], 0
    for length in seqlens:
        if length:
            piece = [t[start:start + length].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]  # [1, H, L, D]
            out = F.scaled_dot_product_attention(*piece, dropout_p=dropout, is_causal=True, scale=scale,
                                                 enable_gqa=piece[0].size(1) != piece[1].size(1))
            outputs.append(out[0].transpose(0, 1))
        start += length
    return torch.cat(outputs) if outputs else q.new_empty(q.shape)


@functools.lru_cache(maxsize=None)
def _flash_varlen_kernel() -> VarlenKernel | None:
    try:
        from transformers.modeling_flash_attention_utils import _lazy_imports, is_flash_attn_available

        if not is_flash_attn_available():
            return None
        varlen = _lazy_imports(None)[1]
    except Exception as exc:  # a broken flash-attn install must not stop training: fall back to the reference
        logger.warning("flash-attention varlen kernel unavailable (%s); using the SDPA reference", exc)
        return None
    if varlen is None:
        return None

    def kernel(q, k, v, *, cu_seqlens, seqlens, max_seqlen, scale, dropout=0.0):
        return varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p=dropout,
                      softmax_scale=scale, causal=True)

    return kernel


def select_varlen_kernel() -> VarlenKernel:
    """The override (tests), else the device layer's hook, else flash varlen on an accelerator, else SDPA."""
    from npu_rl.device import get_backend

    if _OVERRIDE[0] is not None:
        return _OVERRIDE[0]
    backend = get_backend()
    hook = getattr(backend, "varlen_attention", None)
    if hook is not None:
        return hook
    if backend.is_accelerator:
        kernel = _flash_varlen_kernel()
        if kernel is not None:
            return kernel
    return sdpa_varlen


def set_varlen_kernel(kernel: VarlenKernel | None) -> None:
    """Force a kernel for every packed forward (None restores the automatic choice)."""
    _OVERRIDE[0] = kernel


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
               **kwargs):
    """The registered attention function; HF layout in: ``[B, H, S, D]``; out: ``([B, S, H, D], None)``."""
    layout = kwargs.pop(LAYOUT_KWARG, None) or _ACTIVE.get()
    if layout is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      sliding_window=sliding_window, **kwargs)
    if sliding_window is not None:
        raise NotImplementedError("packed attention does not implement sliding-window layers")
    if query.size(0) != 1:
        raise ValueError(f"packed attention expects one packed sequence [1, total], got batch {query.size(0)}")
    if layout.sp_group is not None:
        sp_size = dist.get_world_size(layout.sp_group)
        repeat = kv_repeat_factor(query.size(1), key.size(1), sp_size)
        query = heads_from_sequence(query, layout.sp_group)
        key = heads_from_sequence(key, layout.sp_group, repeat=repeat)
        value = heads_from_sequence(value, layout.sp_group, repeat=repeat)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [S, heads, D]
    out = layout.kernel(q, k, v, cu_seqlens=layout.cu_seqlens, seqlens=layout.seqlens,
                        max_seqlen=layout.max_seqlen, scale=scaling, dropout=dropout).unsqueeze(0)
    if layout.sp_group is not None:
        out = sequence_from_heads(out, layout.sp_group)
    return out, None


def _mask(*args, **kwargs):
    """No mask in packed mode (segments come from the layout); otherwise exactly sdpa's mask."""
    if _ACTIVE.get() is not None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


_REGISTERED = [False]


def register_varlen_attention() -> str:
    """Register ``npu_rl_varlen`` with transformers (once per process); return its name."""
    if not _REGISTERED[0]:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(ATTN_IMPLEMENTATION, _attention)
        AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _mask)
        _REGISTERED[0] = True
    return ATTN_IMPLEMENTATION


def use_varlen_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Select ``npu_rl_varlen`` on an HF model (in place; returns it). Call before ``apply_fsdp2`` or after:
    it only changes ``config._attn_implementation``."""
    name = register_varlen_attention()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name
    if model.config._attn_implementation != name:
        raise ValueError(f"{type(model).__name__} does not accept a custom attention implementation "
                         "(it does not use transformers' AttentionInterface)")
    return model
