"""Packed-attention kernels against the per-segment SDPA reference, and the device layer's choice among them.

On CPU torch, ``flex`` runs eagerly (the same function the compiled kernel computes on a GPU) and
``torch_varlen`` is exercised through its adapter with a stand-in for each ``varlen_attn`` signature (its kernel
is CUDA-only). ``npu_fusion`` is checked for the arguments it hands a stand-in torch_npu.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from npu_rl.device import Backend, make_backend
from npu_rl.parallel import prepare_packed_inputs, use_varlen_attention
from npu_rl.parallel.attention import set_varlen_kernel
from npu_rl.parallel.varlen_kernels import (
    flex_kernel,
    flex_varlen,
    kernel_by_name,
    resolve_kernel,
    sdpa_varlen,
    torch_varlen_call,
)
from tests.parallel.common import make_batch, mean_nll, tiny_model


def _qkv(seqlens, heads=4, kv_heads=2, dim=8, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    total = sum(seqlens)
    q = torch.randn(total, heads, dim, generator=gen, dtype=dtype)
    k = torch.randn(total, kv_heads, dim, generator=gen, dtype=dtype)
    v = torch.randn(total, kv_heads, dim, generator=gen, dtype=dtype)
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, dict(cu_seqlens=cu, seqlens=list(seqlens), max_seqlen=max(seqlens), scale=0.3)


@pytest.mark.parametrize("seqlens", [[5, 3, 7], [1, 9], [13]])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_flex_equals_reference(seqlens, kv_heads):
    q, k, v, layout = _qkv(seqlens, kv_heads=kv_heads)
    torch.testing.assert_close(flex_varlen(q, k, v, **layout), sdpa_varlen(q, k, v, **layout))


def test_flex_with_block_padding_equals_reference(monkeypatch):
    """The compiled path pads the packed length to a multiple of 128; the padding must not leak into the output
    (eager flex here, same padding code)."""
    import npu_rl.parallel.varlen_kernels as vk

    eager = vk._flex_functions(False)
    monkeypatch.setattr(vk, "_flex_functions", lambda compiled: eager)
    q, k, v, layout = _qkv([40, 3, 90])  # 133 -> 256
    out = flex_varlen(q, k, v, **layout, compiled=True)
    assert out.shape == q.shape
    torch.testing.assert_close(out, sdpa_varlen(q, k, v, **layout))


def _flex_backward_runs_here() -> bool:
    q, k, v, layout = _qkv([2])
    try:
        flex_varlen(q.requires_grad_(), k, v, **layout)
    except NotImplementedError:  # torch 2.13's CPU flex_attention has no backward
        return False
    return True


def test_flex_gradients_equal_reference():
    if not _flex_backward_runs_here():
        pytest.skip("flex_attention has no backward on this device (CPU); covered on the GPU run")
    q, k, v, layout = _qkv([6, 2, 9], kv_heads=2)
    grads = []
    for fn in (flex_varlen, sdpa_varlen):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fn(*leaves, **layout)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads.append([t.grad for t in leaves])
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want)


def _reference_varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, causal):
    assert causal and torch.equal(cu_q, cu_k) and max_q == max_k
    lengths = (cu_q[1:] - cu_q[:-1]).tolist()
    return sdpa_varlen(q, k, v, cu_seqlens=cu_q, seqlens=lengths, max_seqlen=max_q, scale=None)


def test_torch_varlen_adapter_old_signature_is_causal_and_repeats_kv():
    seen = {}

    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, is_causal=False, return_aux=None):
        seen.update(kv_heads=key.size(1), is_causal=is_causal)
        return _reference_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal)

    q, k, v, layout = _qkv([4, 6], heads=4, kv_heads=2)
    layout["scale"] = q.size(-1) ** -0.5  # the default scale is accepted without a scale keyword
    out = torch_varlen_call(varlen_attn)(q, k, v, **layout)
    assert seen == {"kv_heads": 4, "is_causal": True}  # GQA expanded for a varlen_attn without enable_gqa
    torch.testing.assert_close(out, sdpa_varlen(q, k, v, **layout))
    layout["scale"] = 0.3
    with pytest.raises(NotImplementedError, match="takes no scale"):
        torch_varlen_call(varlen_attn)(q, k, v, **layout)


def test_torch_varlen_adapter_new_signature_window_scale_gqa():
    seen = {}

    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                    window_size=(-1, -1), enable_gqa=False):
        seen.update(kv_heads=key.size(1), window=window_size, gqa=enable_gqa, scale=scale)
        lengths = (cu_seq_q[1:] - cu_seq_q[:-1]).tolist()
        return sdpa_varlen(query, key, value, cu_seqlens=cu_seq_q, seqlens=lengths, max_seqlen=max_q, scale=scale)

    q, k, v, layout = _qkv([4, 6], heads=4, kv_heads=2)
    out = torch_varlen_call(varlen_attn)(q, k, v, **layout)
    assert seen == {"kv_heads": 2, "window": (-1, 0), "gqa": True, "scale": 0.3}
    torch.testing.assert_close(out, sdpa_varlen(q, k, v, **layout))


def test_installed_torch_varlen_signature_is_understood():
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    torch_varlen_call(varlen.varlen_attn)  # raises TypeError if neither causal keyword exists


def test_device_layer_order_and_override(monkeypatch):
    monkeypatch.delenv("NPU_RL_VARLEN_KERNEL", raising=False)
    assert make_backend("cpu").packed_attention_kernels == ("sdpa",)
    assert make_backend("cuda").packed_attention_kernels[:3] == ("flash_attn", "torch_varlen", "flex")
    assert Backend("npu", "hccl", None, "NPU").packed_attention_kernels[0] == "npu_fusion"  # no torch.npu here
    monkeypatch.setenv("NPU_RL_VARLEN_KERNEL", "flex")
    assert make_backend("cpu").packed_attention_kernels[0] == "flex"
    name, kernel = resolve_kernel(make_backend("cpu").packed_attention_kernels, accelerator=False)
    assert name == "flex"
    # accelerator-only kernels are skipped on CPU, sdpa ends every list
    assert resolve_kernel(("torch_varlen", "flash_attn"), accelerator=False)[0] == "sdpa"
    with pytest.raises(ValueError, match="unknown packed-attention kernel 'flesh'"):
        kernel_by_name("flesh")


def test_npu_fusion_kernel_passes_tnd_and_cumulative_lengths(monkeypatch):
    calls = []

    def npu_fusion_attention(query, key, value, head_num, input_layout, *, atten_mask, scale, keep_prob,
                             actual_seq_qlen, actual_seq_kvlen, sparse_mode):
        calls.append(dict(head_num=head_num, layout=input_layout, mask=tuple(atten_mask.shape), scale=scale,
                          q=actual_seq_qlen, kv=actual_seq_kvlen, sparse=sparse_mode, keep=keep_prob))
        lengths = [b - a for a, b in zip((0, *actual_seq_qlen), actual_seq_qlen)]
        cu = torch.tensor((0, *actual_seq_qlen), dtype=torch.int32)
        return (sdpa_varlen(query, key, value, cu_seqlens=cu, seqlens=lengths, max_seqlen=max(lengths),
                            scale=scale), None, None)

    fake = types.ModuleType("torch_npu")
    fake.npu_fusion_attention = npu_fusion_attention
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    q, k, v, layout = _qkv([3, 5], heads=4, kv_heads=2)
    out = kernel_by_name("npu_fusion")(q, k, v, **layout)
    assert calls == [dict(head_num=4, layout="TND", mask=(2048, 2048), scale=0.3, q=(3, 8), kv=(3, 8), sparse=3,
                          keep=1.0)]
    torch.testing.assert_close(out, sdpa_varlen(q, k, v, **layout))


def test_model_packed_forward_backward_with_flex_equals_padded():
    backward = _flex_backward_runs_here()
    input_ids, mask = make_batch(rows=4, seq_len=12)
    padded_model, packed_model = tiny_model(), use_varlen_attention(tiny_model())
    if not backward:
        packed_model.requires_grad_(False)
    set_varlen_kernel(flex_kernel(compiled=False))
    try:
        inputs = prepare_packed_inputs(input_ids, mask)
        with inputs.attention():
            local = packed_model(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                                 use_cache=False).logits
    finally:
        set_varlen_kernel(None)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    padded = padded_model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids).logits
    valid = mask.bool()
    torch.testing.assert_close(inputs.restore(local)[valid], padded[valid], atol=1e-5, rtol=1e-4)
    if not backward:
        return
    targets = inputs.slice(torch.roll(input_ids, -1, dims=1))
    keep = inputs.slice(mask * torch.roll(mask, -1, dims=1) * (torch.arange(12) < 11)).bool()
    nll = torch.nn.functional.cross_entropy(local[0], targets[0], reduction="none")
    (nll * keep[0]).sum().div(keep.sum()).backward()
    mean_nll(padded_model, input_ids, mask).backward()
    for (name, p), q in zip(packed_model.named_parameters(), padded_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)


def _full_segments(q, k, v, seqlens, scale):
    """Every token attends over its whole segment: plain softmax attention per segment, GQA by repetition."""
    outs, start = [], 0
    repeat = q.size(1) // k.size(1)
    for length in seqlens:
        qs, ks, vs = (t[start:start + length] for t in (q, k, v))
        ks, vs = ks.repeat_interleave(repeat, 1), vs.repeat_interleave(repeat, 1)
        weights = torch.softmax(torch.einsum("qhd,khd->hqk", qs, ks) * scale, dim=-1)
        outs.append(torch.einsum("hqk,khd->qhd", weights, vs))
        start += length
    return torch.cat(outs)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_bidirectional_kernels_attend_over_whole_segments(kv_heads):
    """causal=False (a vision tower's windows): the reference and flex attend over the whole segment."""
    q, k, v, layout = _qkv([5, 3, 7], heads=4, kv_heads=kv_heads)
    expected = _full_segments(q, k, v, layout["seqlens"], layout["scale"])
    for name in ("sdpa", "flex"):
        kernel = kernel_by_name(name, causal=False)
        torch.testing.assert_close(kernel(q, k, v, **layout), expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(sdpa_varlen(q, k, v, **layout), expected)  # the causal default differs
    assert resolve_kernel(("npu_fusion", "sdpa"), accelerator=True, causal=False)[0] == "sdpa"  # unchecked there


def test_torch_varlen_adapter_bidirectional_window_and_flag():
    seen = []

    def new_signature(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                      enable_gqa=False):
        seen.append(window_size)
        return query

    def old_signature(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, is_causal=False):
        seen.append(is_causal)
        return query

    q, k, v, layout = _qkv([4, 6], heads=4, kv_heads=4)
    layout["scale"] = q.size(-1) ** -0.5
    torch_varlen_call(new_signature, causal=False)(q, k, v, **layout)
    torch_varlen_call(old_signature, causal=False)(q, k, v, **layout)
    assert seen == [(-1, -1), False]
