"""Nominal dense peak FLOP/s per device, for MFU.

MFU is reported against the bf16 (tensor-core / cube-unit) dense peak whatever the training dtype, as verl and
torchtitan do. The figures are vendor datasheet numbers; ``NPU_RL_PEAK_TFLOPS`` overrides them for a device that is
missing here or mislabelled. On CPU there is no meaningful datasheet figure: we take a nominal 100 GFLOP/s per
thread in fp32 and 200 GFLOP/s in bf16 (what one AVX-512 core with bf16 instructions measured on a 2048^3 matmul
in the development machine: 96 and 213), so CPU "MFU" is only good for comparing runs on the same machine.
"""

from __future__ import annotations

import torch

# Matched as substrings of the device name, longest key first (so "L40S" wins over "L40", "910B3" over "910B").
_BF16_DENSE_PEAK = {
    "GB200": 2.5e15,
    "B200": 2.25e15,
    "MI300X": 1307e12,
    "H100": 989e12,
    "H800": 989e12,
    "H200": 989e12,
    "H20": 148e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L40": 181e12,
    "L20": 119.5e12,
    "A10G": 70e12,
    # Ascend: torch_npu names the chips "Ascend910B1".."Ascend910B4" (Atlas A2) and "Ascend910_93xx" (Atlas A3,
    # one device per die). verl uses 354 TFLOP/s for the whole 910B family; we keep that as the family default.
    "Ascend910B": 354e12,
    "Ascend910_93": 354e12,
    "910B": 354e12,
}
_CPU_PER_THREAD = {torch.float32: 100e9, torch.bfloat16: 200e9, torch.float16: 200e9}
_UNKNOWN_ACCELERATOR = 312e12  # an A100-class guess, so MFU is still a finite number


def peak_flops(device_name: str, dtype: torch.dtype = torch.bfloat16, num_threads: int = 1) -> float:
    """Peak FLOP/s for ``device_name`` (as reported by the device module, or "CPU")."""
    if device_name.upper() == "CPU":
        return _CPU_PER_THREAD.get(dtype, _CPU_PER_THREAD[torch.float32]) * max(1, num_threads)
    # accelerators: one reference peak per device, the bf16 dense one (see the module docstring)
    for key in sorted(_BF16_DENSE_PEAK, key=len, reverse=True):
        if key in device_name:
            return _BF16_DENSE_PEAK[key]
    return _UNKNOWN_ACCELERATOR
