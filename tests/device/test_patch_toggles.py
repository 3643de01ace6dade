"""The plain computations ``npu-rl doctor --parity`` swaps in for the NPU patches equal Hugging Face's own, and the
swap is undone on exit. (The NPU path itself never ran on an NPU; on CPU the list of patches is empty.)"""

from __future__ import annotations

import torch
from torch.testing import assert_close
from transformers.models.qwen2 import modeling_qwen2

from npu_rl.device.patch_toggles import _eager_rms_norm, _eager_rotary, _hf_targets, _swap, patch_variants


def test_no_patches_to_toggle_off_the_npu():
    assert patch_variants("cpu") == [] and patch_variants("cuda") == []
    assert [name for name, _ in patch_variants("npu")] == ["rms_norm", "rotary", "swiglu", "internal_format",
                                                         "grouped_mm"]


def test_plain_rms_norm_and_rotary_equal_transformers():
    gen = torch.Generator().manual_seed(0)
    norm = modeling_qwen2.Qwen2RMSNorm(16, eps=1e-6)
    norm.weight.data = torch.rand(16, generator=gen) + 0.5
    x = torch.randn(2, 3, 16, generator=gen, dtype=torch.bfloat16)
    assert_close(_eager_rms_norm(norm, x), norm(x))
    q, k = torch.randn(2, 4, 3, 8, generator=gen), torch.randn(2, 4, 3, 8, generator=gen)
    cos, sin = torch.rand(2, 3, 8, generator=gen), torch.rand(2, 3, 8, generator=gen)
    for got, want in zip(_eager_rotary(q, k, cos, sin), modeling_qwen2.apply_rotary_pos_emb(q, k, cos, sin)):
        assert_close(got, want)


def test_swap_is_undone():
    before = modeling_qwen2.apply_rotary_pos_emb, modeling_qwen2.Qwen2RMSNorm.forward
    with _swap(_hf_targets("rotary") + _hf_targets("rms_norm")):
        assert modeling_qwen2.apply_rotary_pos_emb is _eager_rotary
        assert modeling_qwen2.Qwen2RMSNorm.forward is _eager_rms_norm
    assert (modeling_qwen2.apply_rotary_pos_emb, modeling_qwen2.Qwen2RMSNorm.forward) == before
