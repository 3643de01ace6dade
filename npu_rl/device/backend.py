"""The one place that names a device.

A :class:`Backend` is chosen once per process from ``DEVICE=auto|npu|cuda|cpu`` (or ``trainer.device``) and answers
every device question the rest of the package has: which torch module drives the accelerator, which
torch.distributed backend to use, which environment variable restricts visible devices, what Ray calls the
resource, memory figures, synchronisation, seeding, the graph-capture class and the device's peak FLOP/s.

Selection (``auto``): torch_npu importable and an NPU visible -> ``npu``; else CUDA visible -> ``cuda``; else ``cpu``.
An explicit ``npu`` or ``cuda`` that the machine cannot satisfy is an error that says what to install or check,
never a silent fallback.
"""

from __future__ import annotations

import importlib
import os
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from npu_rl.device import flops, npu_patches

VALID_DEVICES = ("auto", "npu", "cuda", "cpu")

_NPU_INSTALL_HINT = (
    "pip install torch-npu==<your torch version> (Ascend's build for your CANN), then `source "
    "/usr/local/Ascend/ascend-toolkit/set_env.sh`; `npu-rl doctor` lists what was found"
)


class DeviceUnavailableError(RuntimeError):
    """Raised when the requested device cannot be used on this machine."""


@dataclass
class Backend:
    """Everything device-specific, behind one object. Build it with :func:`get_backend`."""

    name: str  # "npu" | "cuda" | "cpu": the torch device type
    dist_backend: str  # "hccl" | "nccl" | "gloo"
    visible_devices_env: str | None  # ASCEND_RT_VISIBLE_DEVICES | CUDA_VISIBLE_DEVICES | None
    ray_resource: str | None  # "NPU" | "GPU" | None (CPU-only workers ask Ray for CPUs)
    module: Any = field(default=None, repr=False)  # torch.npu | torch.cuda | None on CPU

    # ----------------------------------------------------------------- devices
    @property
    def is_accelerator(self) -> bool:
        return self.module is not None

    def device(self, index: int | None = None) -> torch.device:
        """The torch device for ``index`` (default: the current one)."""
        if not self.is_accelerator:
            return torch.device("cpu")
        return torch.device(self.name, self.module.current_device() if index is None else index)

    def device_count(self) -> int:
        return self.module.device_count() if self.is_accelerator else 1

    def set_device(self, local_rank: int) -> None:
        if self.is_accelerator:
            self.module.set_device(local_rank)

    def triton_dot_precision(self) -> str | None:
        """``input_precision`` for ``tl.dot`` of bf16/fp16 operands: None (Triton's default) except on Ascend, whose
        triton-ascend options have no default and allow only "ieee" and "hf32"."""
        return "ieee" if self.name == "npu" else None

    def device_name(self) -> str:
        if self.is_accelerator:
            return str(self.module.get_device_name(self.module.current_device()))
        return "CPU"

    def is_bf16_supported(self) -> bool:
        if self.name == "cuda":
            return bool(self.module.is_bf16_supported())
        return True  # Atlas A2/A3 compute in bf16; every CPU can (natively or emulated: see computes_bf16_natively)

    def computes_bf16_natively(self) -> bool:
        """Whether bf16 matmuls are at least as fast as fp32 ones here. False only for an x86 CPU without
        AVX512-BF16 or AMX: there PyTorch converts bf16 through fp32 and a bf16 matmul measured ~8x slower than the
        fp32 one (576x1536 by 432 rows: 95 ms vs 12 ms on an AVX2-only AMD EPYC, torch 2.13). Other CPUs (ARM) are
        taken at their word."""
        if self.name != "cpu":
            return self.is_bf16_supported()
        cpu = torch.cpu
        probes = [getattr(cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
        avx2 = getattr(cpu, "_is_avx2_supported", None)
        if None in probes or avx2 is None or not avx2():  # not x86, or a torch without the probes
            return True
        return any(probe() for probe in probes)

    # ----------------------------------------------------------------- sync and memory
    def synchronize(self) -> None:
        if self.is_accelerator:
            self.module.synchronize()

    def empty_cache(self) -> None:
        if self.is_accelerator:
            self.module.empty_cache()

    def memory_stats_gb(self) -> dict[str, float]:
        """Peak allocated/reserved device memory (0 on CPU) and this process's resident memory, in GiB."""
        import psutil

        gib = 1024**3
        stats = {"cpu_memory_used_gb": psutil.Process().memory_info().rss / gib}
        if self.is_accelerator:
            stats["max_memory_allocated_gb"] = self.module.max_memory_allocated() / gib
            stats["max_memory_reserved_gb"] = self.module.max_memory_reserved() / gib
        else:
            stats["max_memory_allocated_gb"] = 0.0
            stats["max_memory_reserved_gb"] = 0.0
        return stats

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current device; host memory on CPU."""
        if self.is_accelerator:
            free, total = self.module.mem_get_info()
            return int(free), int(total)
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)

    def reset_peak_memory_stats(self) -> None:
        if self.is_accelerator:
            self.module.reset_peak_memory_stats()

    # ----------------------------------------------------------------- randomness
    def manual_seed(self, seed: int) -> None:
        """Seed Python, NumPy, torch and the device generators."""
        random.seed(seed)
        np.random.seed(seed % (2**32))
        torch.manual_seed(seed)
        if self.is_accelerator:
            self.module.manual_seed_all(seed)

    def rng_state(self) -> dict[str, Any]:
        """All generator states, for checkpoints."""
        state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        if self.is_accelerator:
            state["device"] = self.module.get_rng_state()
        return state

    def set_rng_state(self, state: dict[str, Any]) -> None:
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        if self.is_accelerator and "device" in state:
            self.module.set_rng_state(state["device"])

    # ----------------------------------------------------------------- graphs, autocast, flops
    @property
    def graph_class(self) -> type | None:
        """torch.cuda.CUDAGraph / torch.npu.NPUGraph, or None on CPU."""
        if self.name == "cuda":
            return self.module.CUDAGraph
        if self.name == "npu":
            return getattr(self.module, "NPUGraph", None)
        return None

    def peak_flops(self, dtype: torch.dtype = torch.bfloat16) -> float:
        """Nominal dense peak FLOP/s of one device in ``dtype`` (for MFU); ``NPU_RL_PEAK_TFLOPS`` overrides."""
        override = os.environ.get("NPU_RL_PEAK_TFLOPS")
        if override:
            return float(override) * 1e12
        return flops.peak_flops(self.device_name(), dtype, num_threads=torch.get_num_threads())

    def optimizer_kwargs(self, params: list[torch.Tensor]) -> dict[str, Any]:
        """Implementation flags for torch's Adam/AdamW on these parameters. CUDA: ``fused=True`` (one kernel for
        all parameters) when they are plain tensors, ``foreach=True`` for FSDP2's DTensor shards; elsewhere
        torch's default (``NPU_RL_OPTIMIZER_IMPL=fused|foreach|default`` overrides)."""
        choice = os.environ.get("NPU_RL_OPTIMIZER_IMPL", "").strip().lower()
        if not choice:
            if self.name != "cuda":
                return {}
            from torch.distributed.tensor import DTensor

            choice = "foreach" if any(isinstance(p, DTensor) for p in params) else "fused"
        if choice not in ("fused", "foreach", "default"):
            raise ValueError(f"NPU_RL_OPTIMIZER_IMPL={choice!r}; expected fused, foreach or default")
        return {} if choice == "default" else {choice: True}

    @property
    def profiler_activities(self) -> tuple[str, ...]:
        """``torch.profiler.ProfilerActivity`` names that record this device's kernels (Ascend's kernels need
        torch_npu's own profiler, so only the host side there)."""
        return ("CPU", "CUDA") if self.name == "cuda" else ("CPU",)

    @property
    def packed_attention_kernels(self) -> tuple[str, ...]:
        """Packed (remove-padding) attention kernels to try, best first (names of
        :mod:`npu_rl.parallel.varlen_kernels`; the first usable one runs). ``NPU_RL_VARLEN_KERNEL=name`` puts one
        first. Ascend: ``npu_fusion_attention`` (TND). CUDA: flash-attn if installed, else PyTorch's own
        ``varlen_attn`` (flash kernel, no extra package), else compiled ``flex_attention``. CPU: per-segment SDPA
        (exact; ``flex`` eager would materialise ``[H, T, T]`` scores)."""
        order = {"npu": ("npu_fusion", "sdpa"), "cuda": ("flash_attn", "torch_varlen", "flex", "sdpa"),
                 "cpu": ("sdpa",)}[self.name]
        forced = os.environ.get("NPU_RL_VARLEN_KERNEL", "").strip()
        return (forced, *order) if forced else order

    @property
    def compiled_decode(self) -> bool:
        """Whether the hf rollout decodes with transformers' static KV cache and a compiled forward replayed as
        device graphs (``torch.compile(mode="reduce-overhead")``): CUDA only. Measured on an H200 (0.5B shape, 64
        rows x 256 tokens): 4.5 ms per decoded token against 19.9 eager, after a one-off compile of ~20 s per batch
        shape. Ascend compiles through torchair, which transformers' generate does not use; CPU has no graphs to
        replay. ``NPU_RL_COMPILED_DECODE=0|1`` overrides; ``rollout.enforce_eager=True`` turns it off."""
        return _env_switch("NPU_RL_COMPILED_DECODE", self.name == "cuda")

    @property
    def compiles_model_blocks(self) -> bool:
        """Whether ``actor.use_torch_compile`` / ``ref.use_torch_compile`` compile the models' RMSNorm and MLP blocks
        for training forwards (:func:`npu_rl.workers.model_runner.compile_elementwise_blocks`): CUDA only (Ascend's
        compiler path is torchair, not verified here). ``NPU_RL_COMPILE_BLOCKS=0|1`` overrides."""
        return _env_switch("NPU_RL_COMPILE_BLOCKS", self.name == "cuda")

    def local_rank_env(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))


def _env_switch(name: str, default: bool) -> bool:
    """An on/off environment override (``0`` / ``false`` off, anything else on); unset or empty: ``default``."""
    value = os.environ.get(name, "").strip()
    return default if not value else value.lower() not in ("0", "false")


# --------------------------------------------------------------------------- selection
def _npu_probe() -> tuple[bool, str]:
    """(usable, why-not). Importing torch_npu registers ``torch.npu``."""
    try:
        importlib.import_module("torch_npu")
    except ImportError as exc:
        return False, f"torch_npu is not importable ({exc})"
    except RuntimeError as exc:
        # torch_npu registers a [torch.backends] entry point, so `import torch` already loads it and raises
        # RuntimeError when its libraries cannot load (CANN's set_env.sh not sourced, a driver mismatch).
        return False, (f"torch_npu failed to load ({exc}); source CANN's set_env.sh (scripts/atlas/env.sh does) "
                       "or use the Ascend image's Python")
    npu = getattr(torch, "npu", None)
    if npu is None:
        return False, "torch_npu imported but torch.npu is missing (torch / torch_npu version mismatch?)"
    try:
        if not npu.is_available() or npu.device_count() == 0:
            return False, "torch_npu is installed but no NPU is visible (check ASCEND_RT_VISIBLE_DEVICES, npu-smi info)"
    except Exception as exc:  # the driver can raise instead of returning False
        return False, f"torch.npu.is_available() failed: {exc}"
    return True, ""


def _cuda_probe() -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, "torch.cuda.is_available() is False (a CPU build of torch, or no GPU visible)"
    return True, ""


def make_backend(name: str) -> Backend:
    """Build the backend for a resolved device name (no probing)."""
    if name == "npu":
        return Backend("npu", "hccl", "ASCEND_RT_VISIBLE_DEVICES", "NPU", module=torch.npu)
    if name == "cuda":
        return Backend("cuda", "nccl", "CUDA_VISIBLE_DEVICES", "GPU", module=torch.cuda)
    if name == "cpu":
        return Backend("cpu", "gloo", None, None, module=None)
    raise ValueError(f"unknown device {name!r}; expected one of {', '.join(VALID_DEVICES)}")


def select_backend(requested: str | None = None) -> Backend:
    """Resolve ``requested`` (default: ``$DEVICE``, else ``auto``) to a Backend. Errors say what to fix."""
    requested = (requested or os.environ.get("DEVICE") or "auto").strip().lower()
    if requested not in VALID_DEVICES:
        raise ValueError(f"DEVICE={requested!r} is not valid; expected one of {', '.join(VALID_DEVICES)}")
    if requested == "cpu":
        return make_backend("cpu")
    if requested == "npu":
        ok, why = _npu_probe()
        if not ok:
            raise DeviceUnavailableError(f"DEVICE=npu was requested but {why}. To use an NPU: {_NPU_INSTALL_HINT}.")
        backend = make_backend("npu")

        npu_patches.apply_once()
        return backend
    if requested == "cuda":
        ok, why = _cuda_probe()
        if not ok:
            raise DeviceUnavailableError(f"DEVICE=cuda was requested but {why}; use DEVICE=auto or DEVICE=cpu.")
        return make_backend("cuda")
    # auto: NPU first, then GPU, then CPU.
    if _npu_probe()[0]:
        return select_backend("npu")
    if _cuda_probe()[0]:
        return make_backend("cuda")
    return make_backend("cpu")


_BACKEND: Backend | None = None


def get_backend(requested: str | None = None) -> Backend:
    """The process-wide backend, chosen on first call. A later call asking for a different device is an error."""
    global _BACKEND
    if _BACKEND is None:
        _BACKEND = select_backend(requested)
    elif requested not in (None, "auto") and requested != _BACKEND.name:
        raise DeviceUnavailableError(
            f"the device backend was already chosen as {_BACKEND.name!r}; cannot switch to {requested!r} in the "
            "same process"
        )
    return _BACKEND


def reset_backend_for_tests() -> None:
    """Forget the chosen backend (tests only)."""
    global _BACKEND
    _BACKEND = None
