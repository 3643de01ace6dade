"""Ascend's packed attention: ``torch_npu.npu_fusion_attention`` in the ``TND`` layout.

Written against torch_npu's signature (``npu_fusion_attention(query, key, value, head_num, input_layout, pse=None,
padding_mask=None, atten_mask=None, scale=1.0, keep_prob=1.0, pre_tockens=2147483647, next_tockens=2147483647,
inner_precise=0, prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0, ...)``, which returns a
tuple whose first element is the attention output). TND takes ``q: [T, N1, D]``, ``k, v: [T, N2, D]`` (GQA: N1 a
multiple of N2) and the *cumulative* end offsets of the segments as host integers (``actual_seq_qlen``: for lengths
3, 5 it is ``(3, 8)``). Causal masking inside segments is ``sparse_mode=3`` (right-down causal; the same as causal
when query and key lengths are equal, as here) with the fixed 2048 x 2048 upper-triangular compressed mask that
mode requires.

NEVER RUN: no Ascend NPU was available where this was written; the call is tested only against a stand-in
``torch_npu`` (tests/parallel/test_varlen_kernels.py) for the arguments it passes.
"""

from __future__ import annotations

import importlib

import torch

_MASKS: dict[torch.device, torch.Tensor] = {}
_SPARSE_RIGHT_DOWN_CAUSAL = 3


def _causal_mask(device: torch.device) -> torch.Tensor:
    if device not in _MASKS:
        _MASKS[device] = torch.triu(torch.ones(2048, 2048, dtype=torch.bool, device=device), diagonal=1)
    return _MASKS[device]


def npu_fusion_kernel():
    """The kernel (see :mod:`npu_rl.parallel.varlen_kernels` for the signature), or None without torch_npu."""
    try:
        torch_npu = importlib.import_module("torch_npu")
    except ImportError:
        return None
    fusion = getattr(torch_npu, "npu_fusion_attention", None)
    if fusion is None:
        return None

    def kernel(q, k, v, *, cu_seqlens, seqlens, max_seqlen, scale, dropout=0.0):
        ends, total = [], 0
        for length in seqlens:
            total += int(length)
            ends.append(total)
        out = fusion(q, k, v, q.size(1), "TND", atten_mask=_causal_mask(q.device),
                     scale=float(scale if scale is not None else q.size(-1) ** -0.5), keep_prob=1.0 - dropout,
                     actual_seq_qlen=tuple(ends), actual_seq_kvlen=tuple(ends),
                     sparse_mode=_SPARSE_RIGHT_DOWN_CAUSAL)
        return out[0]

    return kernel
