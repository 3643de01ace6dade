"""Variable-length ("packed") attention for HF models, with Ulysses when a sequence-parallel group is active.

:func:`use_varlen_attention` registers one attention implementation, ``npu_rl_varlen``, through transformers'
``AttentionInterface`` (and a matching ``AttentionMaskInterface`` entry) and selects it on the model. It has two
modes:

- inside ``with varlen_attention(layout):`` the model's input is one packed sequence ``[1, total]`` (or this rank's
  slice of it under Ulysses); attention is causal *within* each segment of ``layout.cu_seqlens`` and HF builds no
  mask at all (no ``[total, total]`` tensor);
- outside it, the model behaves exactly like ``sdpa`` (padded batches, ``generate``), so one model object serves
  both the packed training forward and ordinary use.

Kernels (``q, k, v: [total, heads, head_dim]``, GQA allowed) are in :mod:`npu_rl.parallel.varlen_kernels`; the
device layer names the order to try them in (``Backend.packed_attention_kernels``): Ascend
``npu_fusion_attention`` (TND), CUDA flash-attn, else PyTorch's ``varlen_attn``, else compiled ``flex_attention``;
CPU the exact per-segment SDPA reference. A ``varlen_attention`` attribute on the backend object (same signature)
wins over the list, and :func:`set_varlen_kernel` over both (tests).
"""

from __future__ import annotations

import functools
import logging
import os
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.distributed as dist

from npu_rl.device import get_backend
from npu_rl.parallel.ulysses import heads_from_sequence, kv_repeat_factor, sequence_from_heads
from npu_rl.parallel.varlen_kernels import VarlenKernel, resolve_kernel, sdpa_varlen  # noqa: F401 (re-export)

logger = logging.getLogger(__name__)

ATTN_IMPLEMENTATION = "npu_rl_varlen"
# A Qwen-VL vision tower's attention over its windows and pictures as one packed call. transformers' vision attention
# passes ``cu_seqlens`` only to an implementation whose name says "flash" (``is_flash_attention_requested``); any
# other runs one SDPA call per window after a host sync (``cu_seqlens.tolist()``), 16 windows a 448 x 448 picture in
# each of Qwen2.5-VL's 28 windowed blocks.
VISION_ATTN_IMPLEMENTATION = "npu_rl_flash_vision"



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


def _active_layout() -> VarlenLayout | None:
    """The layout of the enclosing :func:`varlen_attention` block. Not read under ``torch.compile`` (a context
    variable is a graph break in every layer): compiled forwards (the hf engine's decoding) are never packed, and a
    packed forward passes its layout as the :data:`LAYOUT_KWARG` keyword anyway."""
    return None if torch.compiler.is_compiling() else _ACTIVE.get()


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


def select_varlen_kernel() -> VarlenKernel:
    """The override (tests), else the device layer's hook, else the first usable kernel of the device layer's
    preference list (``Backend.packed_attention_kernels``; logged once per process)."""
    if _OVERRIDE[0] is not None:
        return _OVERRIDE[0]
    backend = get_backend()
    hook = getattr(backend, "varlen_attention", None)
    if hook is not None:
        return hook
    name, kernel = resolve_kernel(backend.packed_attention_kernels, accelerator=backend.is_accelerator)
    if _CHOSEN.get(backend.name) != name:
        _CHOSEN[backend.name] = name
        logger.info("packed attention kernel on %s: %s", backend.name, name)
    return kernel


_CHOSEN: dict[str, str] = {}


def selected_kernel_name() -> str | None:
    """The name chosen by the last automatic selection (None before any)."""
    return next(iter(_CHOSEN.values()), None)


def set_varlen_kernel(kernel: VarlenKernel | None) -> None:
    """Force a kernel for every packed forward (None restores the automatic choice)."""
    _OVERRIDE[0] = kernel


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
               **kwargs):
    """The registered attention function; HF layout in: ``[B, H, S, D]``; out: ``([B, S, H, D], None)``."""
    layout = kwargs.pop(LAYOUT_KWARG, None) or _active_layout()
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


def select_bidirectional_kernel() -> tuple[str, VarlenKernel]:
    """The first kernel of the device layer's preference list that attends over whole segments (name, kernel);
    resolved once per preference list (a vision tower asks in every block of every pass)."""
    backend = get_backend()
    return _bidirectional_kernel(tuple(backend.packed_attention_kernels), backend.is_accelerator)


@functools.lru_cache(maxsize=None)
def _bidirectional_kernel(preferences: tuple[str, ...], accelerator: bool) -> tuple[str, VarlenKernel]:
    return resolve_kernel(preferences, accelerator=accelerator, causal=False)


def _vision_attention(module, query, key, value, attention_mask=None, dropout=0.0, scaling=None,
                      cu_seq_lens_q=None, cu_seq_lens_k=None, max_length_q=None, max_length_k=None, is_causal=False,
                      **kwargs):
    """The vision tower's registered attention: ``[1, H, S, D]`` in, segments ``cu_seq_lens_q`` (windows or whole
    pictures), each attending over itself; ``([1, S, H, D], None)`` out. Called without segments (another model's
    use of the name), it is sdpa."""
    kwargs.pop(LAYOUT_KWARG, None)
    if cu_seq_lens_q is None or query.size(0) != 1 or is_causal:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if cu_seq_lens_k is not None and cu_seq_lens_k is not cu_seq_lens_q and not torch.equal(cu_seq_lens_k,
                                                                                             cu_seq_lens_q):
        raise NotImplementedError("packed vision attention expects the same segments for queries and keys")
    name, kernel = select_bidirectional_kernel()
    cu_seqlens = cu_seq_lens_q.to(torch.int32)
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    # host lengths only for the kernels that loop or build a mask from them (one sync a call, not one per window)
    seqlens = lengths.tolist() if name in ("sdpa", "flex") else None
    max_seqlen = int(max_length_q) if max_length_q is not None else int(lengths.max())
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [S, heads, D]
    out = kernel(q, k, v, cu_seqlens=cu_seqlens, seqlens=seqlens, max_seqlen=max_seqlen, scale=scaling,
                 dropout=dropout)
    return out.unsqueeze(0), None


def _mask(*args, **kwargs):
    """No mask in packed mode (segments come from the layout); otherwise exactly sdpa's mask."""
    if _active_layout() is not None:
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
        AttentionInterface.register(VISION_ATTN_IMPLEMENTATION, _vision_attention)
        _REGISTERED[0] = True
    return ATTN_IMPLEMENTATION


def _vision_tower_attention(current: str) -> str:
    """A vision-language model's tower attends within its own segments (windows, pictures), not the rows': packed
    per segment (:func:`_vision_attention`) unless it runs FlashAttention (kept) or
    ``NPU_RL_VISION_ATTENTION=transformers`` asks for transformers' per-window SDPA calls (to compare)."""
    if current not in ("sdpa", ATTN_IMPLEMENTATION):
        return current
    return "sdpa" if os.environ.get("NPU_RL_VISION_ATTENTION") == "transformers" else VISION_ATTN_IMPLEMENTATION


def use_varlen_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Select ``npu_rl_varlen`` on an HF model (in place; returns it). Call before ``apply_fsdp2`` or after:
    it only changes ``config._attn_implementation``."""
    name = register_varlen_attention()
    vision = getattr(model.config, "vision_config", None)
    tower = _vision_tower_attention(vision._attn_implementation or "sdpa") if vision is not None else None
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
        if tower is not None:
            model.set_attn_implementation({"vision_config": tower})
    else:
        model.config._attn_implementation = name
    if model.config._attn_implementation != name:
        raise ValueError(f"{type(model).__name__} does not accept a custom attention implementation "
                         "(it does not use transformers' AttentionInterface)")
    return model
