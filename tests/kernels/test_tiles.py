"""Per-device tile selection (verl #7950: a GPU autotune tile needed ~8.6 Mbit on chip; a 910B has 1.5 Mbit of UB)."""

from __future__ import annotations

import pytest
import torch

from npu_rl.kernels import _device, linear_ops
from npu_rl.kernels.tiles import (
    CANDIDATES,
    TileConfig,
    budget_for,
    fits,
    select_row_tiles,
    select_tiles,
    tile_footprint,
)

UB_910B = 192 * 1024  # bytes: 1,572,864 bits


@pytest.mark.parametrize("name", ["npu:Ascend910B3", "npu:Ascend910B1", "npu:Ascend910_9382"])
def test_ascend_tile_fits_the_unified_buffer(name):
    for itemsize in (2, 4):
        tile = select_tiles(name, itemsize)
        fp = tile_footprint(tile, itemsize, multibuffer=2)  # triton-ascend double-buffers by default
        assert fp.vector_bytes <= UB_910B, (tile, fp)
        assert fp.accumulator_bytes <= 128 * 1024  # L0C
        assert fp.l0_operand_bytes <= 64 * 1024  # L0A / L0B
    row = select_row_tiles(name)
    assert tile_footprint(row, 4, multibuffer=2).vector_bytes <= UB_910B


def test_gpu_tiles_do_not_fit_ascend():
    ascend = budget_for("npu:Ascend910B3")
    verl_like = TileConfig(128, 256, 64, 3, 8)  # the kind of GPU autotune entry that broke on NPU
    assert not fits(verl_like, ascend, 2)
    assert not fits(select_tiles("cuda:NVIDIA H200", 2), ascend, 2)


def test_hopper_gets_the_large_tile_and_fewer_stages_in_float32():
    bf16, fp32 = select_tiles("cuda:NVIDIA H200", 2), select_tiles("cuda:NVIDIA H200", 4)
    assert (bf16.block_n, bf16.block_v) == (128, 128)
    assert fp32.stages < bf16.stages  # 4 stages of float32 operands exceed 227 KB of shared memory
    for tile, itemsize in ((bf16, 2), (fp32, 4)):
        assert tile_footprint(tile, itemsize).operand_bytes <= 227 * 1024


def test_unknown_cuda_device_gets_a_conservative_tile_and_unknown_types_fail():
    tile = select_tiles("cuda:Some Future GPU", 2)
    assert tile_footprint(tile, 2).operand_bytes <= 99 * 1024
    assert "H20" == budget_for("cuda:NVIDIA H20").name  # not shadowed by H200's entry, nor H200 by H20's
    assert "H200" == budget_for("cuda:NVIDIA H200").name
    with pytest.raises(ValueError, match="no tile budget"):
        select_tiles("xpu:Arc")
    assert all(c.block_n >= 16 and c.block_v >= 16 and c.block_k >= 16 for c in CANDIDATES)  # tl.dot minimum


def test_the_plan_asks_the_device_layer(monkeypatch):
    """A stand-in Ascend device: the op plans with the 910B tile, without naming the device itself."""
    monkeypatch.setattr(_device, "device_kind", lambda: "npu:Ascend910B3")
    monkeypatch.setattr(_device, "resolve_backend", lambda backend, tensor: "triton")
    hidden = torch.zeros(4096, 896, dtype=torch.bfloat16)
    plan = linear_ops._plan("auto", hidden, 151_936, None, None, None)
    assert plan.tile == select_tiles("npu:Ascend910B3", 2)
    assert plan.num_cores == 20
    # the backward's [N, chunk] gradient buffer stays within DEFAULT_CHUNK_BYTES and is a whole number of tiles
    assert 4096 * plan.vocab_chunk_size * 2 <= linear_ops.DEFAULT_CHUNK_BYTES
    assert plan.vocab_chunk_size % plan.tile.block_v == 0


def test_auto_backend_is_torch_on_cpu(monkeypatch):
    monkeypatch.delenv("NPU_RL_KERNEL_BACKEND", raising=False)
    if _device.accelerator_name() == "cpu":
        assert _device.resolve_backend("auto", torch.zeros(1)) == "torch"
    monkeypatch.setenv("NPU_RL_KERNEL_BACKEND", "torch")
    assert _device.resolve_backend("auto", torch.zeros(1)) == "torch"
