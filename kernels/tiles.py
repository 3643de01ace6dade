"""Tile sizes chosen per device from its on-chip buffer budget (verl #7950), not from one autotune list.

verl's fused linear-cross-entropy kernel autotunes over GPU tiles whose buffers need ~8.6 Mbit on chip; an Ascend
910B AI core has a 192 KB (1.5 Mbit) Unified Buffer, so the kernel does not compile there. Here every device kind
has a budget (:data:`BUDGETS`) and :func:`select_tiles` walks one preference-ordered candidate list, returning the
first tile whose estimated footprint fits that budget. The estimate (:func:`tile_footprint`) counts:

- ``operand_bytes``: the pipelined operand tiles, ``stages * (block_n + block_v) * block_k * itemsize``. On NVIDIA
  GPUs they sit in shared memory; on Ascend in L1, and one stage of each operand in L0A / L0B.
- ``accumulator_bytes``: the ``[block_n, block_v]`` float32 logits tile, in registers (GPU) or L0C (Ascend).
- ``vector_bytes``: the float32 tiles alive in the epilogue (logits, exp, masked products ...), ``EPILOGUE_TILES *
  block_n * block_v * 4``, doubled by triton-ascend's default multi-buffering. On Ascend these live in the UB,
  which is the limit that verl's tile broke; on GPUs they are registers, bounded by ``register_bytes``.

Figures are datasheet / vendor-doc values (shared memory per block: 227 KB on H100/H200, 163 KB on A100, 99 KB on
Ada/Ampere consumer parts; Ascend A2 (910B): UB 192 KB, L1 512 KB, L0A/L0B 64 KB, L0C 128 KB, 24 cube cores on
910B1/B2, 20 on B3/B4). Unknown devices get the most conservative budget of their type.
"""

from __future__ import annotations

from dataclasses import dataclass

KB = 1024
EPILOGUE_TILES = 4  # float32 [block_n, block_v] tiles alive at once in the epilogue (z, exp(z - m), products, mask)


@dataclass(frozen=True)
class DeviceBudget:
    """On-chip memory one program (CTA / AI core) may use, and how many run at once."""

    name: str
    operand_bytes: int  # shared memory (GPU) or L1 (Ascend) for pipelined operand tiles
    accumulator_bytes: int  # registers (GPU) or L0C (Ascend) for the float32 accumulator
    vector_bytes: int  # registers (GPU) or UB (Ascend) for the float32 epilogue tiles
    num_cores: int  # SMs / AI cores: sizes the grid
    l0_operand_bytes: int = 0  # Ascend L0A / L0B: one stage of one operand must fit; 0 = no such limit
    multibuffer: int = 1  # triton-ascend double-buffers UB allocations by default


# Matched as substrings of "<type>:<device name>", first match wins (so put "H20" after "H200").
BUDGETS: tuple[tuple[str, DeviceBudget], ...] = (
    ("cuda:NVIDIA H200", DeviceBudget("H200", 227 * KB, 128 * KB, 256 * KB, 132)),
    ("cuda:NVIDIA H100", DeviceBudget("H100", 227 * KB, 128 * KB, 256 * KB, 132)),
    ("cuda:NVIDIA H800", DeviceBudget("H800", 227 * KB, 128 * KB, 256 * KB, 132)),
    ("cuda:NVIDIA H20", DeviceBudget("H20", 227 * KB, 128 * KB, 256 * KB, 78)),
    ("cuda:NVIDIA A100", DeviceBudget("A100", 163 * KB, 128 * KB, 256 * KB, 108)),
    ("cuda:NVIDIA A800", DeviceBudget("A800", 163 * KB, 128 * KB, 256 * KB, 108)),
    ("cuda:", DeviceBudget("cuda-generic", 99 * KB, 64 * KB, 128 * KB, 64)),
    ("npu:Ascend910B1", DeviceBudget("910B1", 512 * KB, 128 * KB, 192 * KB, 24, 64 * KB, 2)),
    ("npu:Ascend910B2", DeviceBudget("910B2", 512 * KB, 128 * KB, 192 * KB, 24, 64 * KB, 2)),
    ("npu:", DeviceBudget("910B", 512 * KB, 128 * KB, 192 * KB, 20, 64 * KB, 2)),
    # Triton's CPU interpreter: no on-chip limit, but every op costs Python time, so fewer, wider tiles win.
    ("cpu:", DeviceBudget("interpreter", 1 << 30, 1 << 30, 1 << 30, 2)),
)


def budget_for(device_kind: str) -> DeviceBudget:
    """The budget whose key is a substring of ``device_kind`` (``"cuda:NVIDIA H200"``, ``"npu:Ascend910B3"`` ...)."""
    for key, budget in BUDGETS:
        if key in device_kind:
            return budget
    raise ValueError(f"no tile budget for device {device_kind!r}; known keys: {', '.join(k for k, _ in BUDGETS)}")


@dataclass(frozen=True)
class TileConfig:
    block_n: int  # tokens per tile
    block_v: int  # vocabulary columns per tile
    block_k: int  # hidden features per dot step
    stages: int = 2  # software-pipeline depth of the operand loads
    warps: int = 4


@dataclass(frozen=True)
class Footprint:
    operand_bytes: int
    accumulator_bytes: int
    vector_bytes: int
    l0_operand_bytes: int


def tile_footprint(tile: TileConfig, itemsize: int, multibuffer: int = 1) -> Footprint:
    """Estimated on-chip bytes of one program of the fused kernels (see the module docstring)."""
    acc = tile.block_n * tile.block_v * 4
    return Footprint(
        operand_bytes=tile.stages * (tile.block_n + tile.block_v) * tile.block_k * itemsize,
        accumulator_bytes=acc,
        vector_bytes=EPILOGUE_TILES * acc * multibuffer,
        l0_operand_bytes=max(tile.block_n, tile.block_v) * tile.block_k * itemsize,
    )


def fits(tile: TileConfig, budget: DeviceBudget, itemsize: int) -> bool:
    fp = tile_footprint(tile, itemsize, budget.multibuffer)
    return (
        fp.operand_bytes <= budget.operand_bytes
        and fp.accumulator_bytes <= budget.accumulator_bytes
        and fp.vector_bytes <= budget.vector_bytes
        and (budget.l0_operand_bytes == 0 or fp.l0_operand_bytes <= budget.l0_operand_bytes)
    )


# Preference order: big tiles first (more reuse per byte loaded), then shallower pipelines, then smaller tiles.
CANDIDATES: tuple[TileConfig, ...] = (
    TileConfig(128, 128, 64, 4, 8),
    TileConfig(128, 128, 64, 3, 8),
    TileConfig(128, 128, 32, 3, 8),
    TileConfig(64, 128, 64, 3, 4),
    TileConfig(64, 128, 32, 2, 4),
    TileConfig(64, 64, 64, 2, 4),
    TileConfig(32, 64, 64, 2, 4),
    TileConfig(32, 64, 32, 2, 4),
    TileConfig(16, 64, 32, 1, 4),
    TileConfig(16, 32, 16, 1, 4),
)
INTERPRETER_TILE = TileConfig(32, 4096, 32, 1, 4)


def select_tiles(device_kind: str, itemsize: int = 2) -> TileConfig:
    """The first candidate tile that fits ``device_kind``'s budget for operands of ``itemsize`` bytes."""
    budget = budget_for(device_kind)
    if budget.name == "interpreter":
        return INTERPRETER_TILE
    for tile in CANDIDATES:
        if fits(tile, budget, itemsize):
            return tile
    raise ValueError(f"no candidate tile fits {budget}; add a smaller one to CANDIDATES")


# Row kernels of the "triton_mm" backend read logits from memory (no dot): few rows, wide columns, one stage.
ROW_CANDIDATES: tuple[TileConfig, ...] = (
    TileConfig(8, 1024, 16, 1, 4),
    TileConfig(8, 512, 16, 1, 4),
    TileConfig(4, 512, 16, 1, 4),
    TileConfig(4, 256, 16, 1, 4),
    TileConfig(1, 256, 16, 1, 4),
)


def select_row_tiles(device_kind: str) -> TileConfig:
    """The first row-kernel tile whose float32 epilogue tiles fit ``device_kind``'s vector budget."""
    budget = budget_for(device_kind)
    if budget.name == "interpreter":
        return INTERPRETER_TILE
    for tile in ROW_CANDIDATES:
        if tile_footprint(tile, 4, budget.multibuffer).vector_bytes <= budget.vector_bytes:
            return tile
    raise ValueError(f"no row tile fits {budget}")


def num_cores(device_kind: str) -> int:
    return budget_for(device_kind).num_cores
