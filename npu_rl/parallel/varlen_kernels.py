"""Packed (variable-length, causal) attention kernels built from torch alone, by name.

Every kernel has one signature: ``kernel(q, k, v, *, cu_seqlens, seqlens, max_seqlen, scale, dropout) -> out`` with
``q: [T, H, D]``, ``k, v: [T, KV, D]`` (GQA: ``H % KV == 0``), ``cu_seqlens`` the int32 segment offsets on the
device and ``seqlens`` the same lengths on the host. Attention is causal inside each segment and zero across;
built with ``causal=False`` (:func:`kernel_by_name`), a kernel attends over its whole segment (a vision tower's
windows and pictures).

Names (which ones a device tries, in order, is the device layer's choice: ``Backend.packed_attention_kernels``):

- ``flash_attn``: the flash-attn package's ``flash_attn_varlen_func`` through transformers (when installed).
- ``torch_varlen``: ``torch.nn.attention.varlen.varlen_attn`` (PyTorch >= 2.10, CUDA; PyTorch's own flash
  kernel, forward and backward). Its keyword for causal masking changed between releases (``is_causal`` /
  ``window_size=(-1, 0)``), and GQA support too, so the call is built from its signature.
- ``flex``: ``flex_attention`` with a block mask "same segment and causal", compiled on an accelerator (eager on
  CPU, where it materialises the ``[H, T, T]`` scores: tests only). The packed length is padded up to a multiple of
  128 so the compiled kernel sees few distinct shapes; padding rows attend to themselves only and are dropped.
- ``sdpa``: the exact reference, ``scaled_dot_product_attention`` per segment (``O(sum L_i^2)``, no mask tensor).
- ``npu_fusion``: Ascend's ``npu_fusion_attention`` (TND); it lives in the device layer
  (:mod:`npu_rl.device.npu_attention`) and is only looked up here by name.

:func:`resolve_kernel` returns the first name of a preference list whose kernel is usable in this process.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Callable

import torch
import torch.nn.functional as F

from npu_rl.device.npu_attention import npu_fusion_kernel

logger = logging.getLogger(__name__)

VarlenKernel = Callable[..., torch.Tensor]
KERNEL_NAMES = ("npu_fusion", "flash_attn", "torch_varlen", "flex", "sdpa")


def sdpa_varlen(q, k, v, *, cu_seqlens, seqlens, max_seqlen, scale, dropout=0.0, causal=True) -> torch.Tensor:
    """Reference kernel: SDPA on each segment (causal unless ``causal=False``). ``q: [T, H, D]``,
    ``k, v: [T, KV, D]``."""
    outputs, start = [], 0
    for length in seqlens:
        if length:
            piece = [t[start:start + length].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]  # [1, H, L, D]
            out = F.scaled_dot_product_attention(*piece, dropout_p=dropout, is_causal=causal, scale=scale,
                                                 enable_gqa=piece[0].size(1) != piece[1].size(1))
            outputs.append(out[0].transpose(0, 1))
        start += length
    return torch.cat(outputs) if outputs else q.new_empty(q.shape)


def _no_dropout(name: str, dropout: float) -> None:
    if dropout:
        raise NotImplementedError(f"packed attention kernel {name!r} has no dropout (got {dropout}); RL actors "
                                  "run with attention_dropout=0")


# ---------------------------------------------------------------------------------------------- flash-attn package
@functools.lru_cache(maxsize=None)
def flash_attn_kernel(causal: bool = True) -> VarlenKernel | None:
    try:
        from transformers.modeling_flash_attention_utils import _lazy_imports, is_flash_attn_available

        if not is_flash_attn_available():
            return None
        varlen = _lazy_imports(None)[1]
    except Exception as exc:  # a broken flash-attn install must not stop training: the next kernel is tried
        logger.warning("flash-attention varlen kernel unavailable (%s)", exc)
        return None
    if varlen is None:
        return None

    def kernel(q, k, v, *, cu_seqlens, seqlens, max_seqlen, scale, dropout=0.0):
        return varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p=dropout,
                      softmax_scale=scale, causal=causal)

    return kernel


# ---------------------------------------------------------------------------------------------- torch varlen_attn
def _repeat_kv(t: torch.Tensor, repeat: int) -> torch.Tensor:
    return t if repeat == 1 else t.repeat_interleave(repeat, dim=1)


def torch_varlen_call(varlen_attn: Callable, causal: bool = True) -> VarlenKernel:
    """Adapt ``varlen_attn`` of whatever torch release to the kernel signature (from its parameters); ``causal``
    False: attention over the whole segment (``window_size=(-1, -1)``)."""
    params = inspect.signature(varlen_attn).parameters
    if "is_causal" in params:
        masking = {"is_causal": causal}
    elif "window_size" in params:
        masking = {"window_size": (-1, 0) if causal else (-1, -1)}
    else:
        raise TypeError(f"varlen_attn{inspect.signature(varlen_attn)} takes neither is_causal nor window_size")
    takes_scale, takes_gqa = "scale" in params, "enable_gqa" in params

    def kernel(q, k, v, *, cu_seqlens, seqlens, max_seqlen, scale, dropout=0.0):
        _no_dropout("torch_varlen", dropout)
        extra = dict(masking)
        if scale is not None:
            if takes_scale:
                extra["scale"] = scale
            elif abs(scale - q.size(-1) ** -0.5) > 1e-6 * scale:
                raise NotImplementedError(f"this torch's varlen_attn takes no scale; the model asks for {scale}")
        if k.size(1) != q.size(1):
            if takes_gqa:
                extra["enable_gqa"] = True
            else:
                k, v = (_repeat_kv(t, q.size(1) // k.size(1)) for t in (k, v))
        return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **extra)

    return kernel


@functools.lru_cache(maxsize=None)
def torch_varlen_kernel(causal: bool = True) -> VarlenKernel | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    try:
        return torch_varlen_call(varlen_attn, causal)
    except TypeError as exc:
        logger.warning("torch varlen_attn not usable: %s", exc)
        return None


# ---------------------------------------------------------------------------------------------- flex_attention
FLEX_BLOCK = 128


@functools.lru_cache(maxsize=4)
def _flex_functions(compiled: bool):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    return (torch.compile(flex_attention) if compiled else flex_attention), create_block_mask


def flex_varlen(q, k, v, *, cu_seqlens, seqlens, max_seqlen, scale, dropout=0.0, compiled: bool = False,
                causal: bool = True):
    """Causal-within-segment attention (``causal=False``: the whole segment) through ``flex_attention`` (see the
    module docstring)."""
    _no_dropout("flex", dropout)
    total = q.size(0)
    padded = -(-total // FLEX_BLOCK) * FLEX_BLOCK if compiled else total
    lengths = torch.as_tensor(seqlens, device=q.device)
    segment = torch.repeat_interleave(torch.arange(len(seqlens), device=q.device), lengths)
    if padded > total:  # each padding row is its own segment: it sees itself only, and is cut off below
        segment = torch.cat([segment, torch.arange(len(seqlens), len(seqlens) + padded - total, device=q.device)])
        q, k, v = (F.pad(t, (0, 0, 0, 0, 0, padded - total)) for t in (q, k, v))
    flex_attention, create_block_mask = _flex_functions(compiled)

    def same_segment_causal(b, h, q_idx, kv_idx):
        return (segment[q_idx] == segment[kv_idx]) & (q_idx >= kv_idx)

    def same_segment(b, h, q_idx, kv_idx):
        return segment[q_idx] == segment[kv_idx]

    block_mask = create_block_mask(same_segment_causal if causal else same_segment, B=None, H=None, Q_LEN=padded, KV_LEN=padded,
                                   device=q.device, _compile=compiled)  # compiled: no [T, T] mask in memory
    q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, T, D]
    out = flex_attention(q4, k4, v4, block_mask=block_mask, scale=scale, enable_gqa=k.size(1) != q.size(1))
    return out[0].transpose(0, 1)[:total]


def flex_kernel(compiled: bool, causal: bool = True) -> VarlenKernel:
    return functools.partial(flex_varlen, compiled=compiled, causal=causal)


# ---------------------------------------------------------------------------------------------- choice
def kernel_by_name(name: str, *, accelerator: bool = False, causal: bool = True) -> VarlenKernel | None:
    """The kernel called ``name`` if it can run in this process, else None. Unknown names are an error.
    ``causal=False`` (a vision tower's windows): attention over the whole segment, where the kernel has that mode;
    ``npu_fusion``'s bidirectional TND call has not been checked against torch_npu, so it answers None there."""
    if name == "sdpa":
        return sdpa_varlen if causal else functools.partial(sdpa_varlen, causal=False)
    if name == "flash_attn":
        return flash_attn_kernel(causal) if accelerator else None
    if name == "torch_varlen":
        return torch_varlen_kernel(causal) if accelerator else None
    if name == "flex":
        try:
            _flex_functions(accelerator)
        except ImportError:
            return None
        return flex_kernel(compiled=accelerator, causal=causal)
    if name == "npu_fusion":
        return npu_fusion_kernel() if causal else None
    raise ValueError(f"unknown packed-attention kernel {name!r}; expected one of {', '.join(KERNEL_NAMES)}")


def resolve_kernel(preferences: list[str] | tuple[str, ...], *, accelerator: bool,
                   causal: bool = True) -> tuple[str, VarlenKernel]:
    """The first usable kernel of ``preferences`` (``sdpa`` is always usable and ends every list)."""
    for name in preferences:
        kernel = kernel_by_name(name, accelerator=accelerator, causal=causal)
        if kernel is not None:
            return name, kernel
    return "sdpa", kernel_by_name("sdpa", causal=causal)
