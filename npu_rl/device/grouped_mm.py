"""Where ``torch._grouped_mm`` runs eagerly (the device layer names the devices: npu_rl/device/__init__.py)."""

from __future__ import annotations

import torch


def _aligned(t: torch.Tensor) -> bool:
    """``torch._grouped_mm``'s layout rule: the data and every stride but the unit one on 16-byte boundaries."""
    size = t.element_size()
    return t.data_ptr() % 16 == 0 and all(s * size % 16 == 0 for s in t.stride() if s != 1)


def torch_grouped_mm_runs(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` runs these tensors eagerly: CPU (any float dtype, torch >= 2.9), CUDA bf16 on
    sm80 and newer; aligned tensors only (an NPU has no kernel for it: npu_rl/device/npu_experts.py)."""
    if not hasattr(torch, "_grouped_mm") or not (_aligned(x) and _aligned(weight)):
        return False
    if x.device.type == "cpu":
        return True
    if x.device.type == "cuda":
        return x.dtype == weight.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) >= (8, 0)
    return False
