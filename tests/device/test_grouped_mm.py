"""Where torch._grouped_mm runs eagerly: on the CPU for aligned tensors of any float dtype; misaligned views fall to
the per-expert loop (npu_rl/models/compiled_experts.py)."""

import pytest
import torch

from npu_rl.device.grouped_mm import torch_grouped_mm_runs

pytestmark = pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch without _grouped_mm")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_aligned_cpu_tensors_run_and_give_the_per_expert_products(dtype):
    x, w = torch.randn(6, 8, dtype=dtype), torch.randn(2, 8, 8, dtype=dtype)  # rows of 16 bytes or more
    assert torch_grouped_mm_runs(x, w)
    offsets = torch.tensor([2, 6], dtype=torch.int32)
    out = torch._grouped_mm(x, w, offs=offsets)
    torch.testing.assert_close(out, torch.cat([x[:2] @ w[0], x[2:] @ w[1]]))


def test_a_view_off_16_byte_boundaries_does_not():
    x = torch.randn(6, 9)[:, 1:]  # rows of 9 floats: a stride of 36 bytes
    assert not torch_grouped_mm_runs(x, torch.randn(2, 8, 4))
