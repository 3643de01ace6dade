"""The kernels' one window onto the device layer.

Everything in ``npu_rl.kernels`` that needs to know which accelerator it runs on asks here, and this module asks
:func:`npu_rl.device.get_backend`; no other file of the package names a device. It answers four questions:

- which backend ``"auto"`` resolves to for a given tensor (Triton on an accelerator that has it, else torch);
- which device the tile budget table should describe (:func:`device_kind`, ``"cuda:NVIDIA H200"`` ...);
- whether Triton runs in its CPU interpreter (``TRITON_INTERPRET=1``), where bf16 ``tl.dot`` is not usable;
- whether ``torch.addmm(..., out_dtype=torch.float32)`` works on this device (fp32 accumulation of bf16 products).
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from npu_rl.device import get_backend

BACKENDS = ("auto", "torch", "triton", "triton_mm")


def accelerator_name() -> str:
    """The torch device type the device layer chose for this process."""
    return get_backend().name


def device_kind() -> str:
    """``"<type>:<device name>"`` of the current accelerator (``"cpu:CPU"`` without one), for the tile budget table."""
    backend = get_backend()
    return f"{backend.name}:{backend.device_name()}"


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def default_dot_precision() -> str | None:
    """``input_precision`` for ``tl.dot`` of bf16/fp16 operands: None (Triton's default) except on Ascend, where
    triton-ascend's options have no default (``tl.dot(..., input_precision=None)`` fails with "'NPUOptions' object
    has no attribute 'default_dot_input_precision'", found by lowering the kernels through its front end) and allow
    only "ieee" and "hf32"."""
    return get_backend().triton_dot_precision()


def triton_interpreted() -> bool:
    """Whether Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``, read when kernels are defined)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve_backend(backend: str, tensor: torch.Tensor) -> str:
    """Resolve ``backend`` (one of :data:`BACKENDS`) for inputs living on ``tensor.device``.

    ``auto``: ``triton_mm`` when the tensor is on the process's accelerator and Triton is installed, else ``torch``
    (the chunked reference, which runs anywhere torch does); ``NPU_RL_KERNEL_BACKEND=torch|triton|triton_mm`` overrides
    what ``auto`` means for the whole process. An explicit ``triton`` on CPU tensors works only in the interpreter;
    anything else is refused here with the reason, never silently replaced.
    """
    if backend == "auto" and os.environ.get("NPU_RL_KERNEL_BACKEND"):
        backend = os.environ["NPU_RL_KERNEL_BACKEND"]
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    on_accelerator = tensor.device.type != "cpu" and tensor.device.type == accelerator_name()
    if backend == "auto":  # triton_mm: measured faster than the fully fused kernels on the H200 (docs/benchmarks.md)
        return "triton_mm" if on_accelerator and triton_available() else "torch"
    if backend.startswith("triton"):
        if not triton_available():
            raise ValueError(f"backend={backend!r} needs the triton package (triton, or triton-ascend on Ascend)")
        if not on_accelerator and not triton_interpreted():
            raise ValueError(
                f"backend={backend!r} got tensors on {tensor.device}; Triton runs on the accelerator, or on CPU only "
                "with TRITON_INTERPRET=1 set before the kernels are imported"
            )
    return backend


@functools.lru_cache(maxsize=None)
def _addmm_out_dtype_works(device_type: str) -> bool:
    try:
        acc = torch.zeros(2, 2, device=device_type)
        a = torch.ones(2, 2, device=device_type, dtype=torch.bfloat16)
        torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
        return bool(acc[0, 0].item() == 2.0)
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def addmm_fp32_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b`` with ``acc`` float32 and ``a``, ``b`` possibly bf16/fp16, accumulating in float32.

    Where the device's torch has ``addmm(out_dtype=float32)`` (CUDA, torch >= 2.8) the product is added without a
    temporary; elsewhere a temporary of ``acc``'s shape is made in ``a``'s dtype and added in float32.
    """
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    elif _addmm_out_dtype_works(acc.device.type):
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc += torch.mm(a, b).float()
