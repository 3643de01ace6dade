"""Every torch_npu / vLLM-Ascend / triton-ascend name our code relies on, as data.

Two consumers: ``tests/device/test_real_packages.py`` checks each fact against what was read from the real releases
(``tests/data/ascend_wheels.json``, recorded by ``tests/ascend_wheel_facts.py``; with ``NPU_RL_SLOW=1`` it downloads
them again and compares); the stand-in ``torch_npu`` of the fast tests (``tests/device/test_device.py``) builds its
functions from :data:`TORCH_NPU_SIGNATURES` and exposes only :data:`TORCH_NPU_DEVICE_API`, so a call our code makes
with a wrong keyword fails here too. Add a fact whenever the code starts using a new name.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass

# ------------------------------------------------------------------------------------------------ torch_npu
# torch.npu functions the device layer calls (npu_rl/device/backend.py, npu_patches.py); all are in
# torch_npu/npu/__init__.py's __all__.
TORCH_NPU_DEVICE_API = (
    "is_available", "device_count", "current_device", "set_device", "get_device_name", "is_bf16_supported",
    "synchronize", "empty_cache", "max_memory_allocated", "max_memory_reserved", "mem_get_info",
    "reset_peak_memory_stats", "manual_seed_all", "get_rng_state", "set_rng_state", "set_compile_mode", "config",
    "NPUGraph", "memory_allocated",
)

# Python-level signatures (torch_npu/_op_plugin_docs.py for the fused ops; npu_config.py; profiler).
TORCH_NPU_SIGNATURES = {
    # "torch_npu.npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)"
    "npu_rms_norm": "(self, gamma, epsilon=1e-06)",
    # "torch_npu.npu_rotary_mul(Tensor input, Tensor r1, Tensor r2, str rotary_mode='half') -> Tensor"
    "npu_rotary_mul": "(input, r1, r2, rotary_mode='half')",
    # "torch_npu.npu_swiglu(Tensor self, int dim=-1) -> (Tensor)": silu(first half) * second half along dim
    "npu_swiglu": "(self, dim=-1)",
    "set_compile_mode": "(jit_compile=False)",
    "profiler.schedule": "(wait, active, warmup=0, repeat=0, skip_first=0)",
    "profiler.tensorboard_trace_handler": "(dir_name=None, worker_name=None, analyse_flag=True, async_mode=False)",
}

# How npu_rl/device/npu_patches.py calls the fused ops: positional argument count, keywords. Each wheel's documented
# signature must accept these calls, and begin with the stand-in's (later releases append optional arguments:
# torch_npu 2.10 added ``rotate=None`` to npu_rotary_mul).
TORCH_NPU_OP_CALLS = {"npu_rms_norm": (2, ("epsilon",)), "npu_rotary_mul": (3, ()), "npu_swiglu": (1, ("dim",)),
                      # npu_rl/device/npu_attention.py: (q, k, v, head_num, "TND", atten_mask=..., ...)
                      "npu_fusion_attention": (5, ("atten_mask", "scale", "keep_prob", "actual_seq_qlen",
                                                   "actual_seq_kvlen", "sparse_mode"))}

# torch.npu.config: a class defining __setattr__ only (no __getattr__), acting on "allow_internal_format", so
# hasattr() on it is False and the option must be assigned blindly (break 4 of issue 12).
TORCH_NPU_CONFIG = {"file": "torch_npu/npu/npu_config.py", "class": "_npuConfig", "key": "allow_internal_format"}

# torch_npu.profiler names the profiling module uses; profile() is keyword-only.
TORCH_NPU_PROFILER = {
    "exports": ("profile", "ProfilerActivity", "tensorboard_trace_handler", "schedule", "_ExperimentalConfig",
                "ProfilerLevel"),
    "profile_kwargs": ("activities", "schedule", "on_trace_ready", "record_shapes", "profile_memory", "with_stack",
                       "experimental_config"),
    # _ExperimentalConfig keywords npu_rl/device/profiler_backend.py passes; ProfilerLevel attributes it names
    "experimental_kwargs": ("profiler_level", "mstx"),
    "levels": ("Level0", "Level1", "Level2", "Level_none"),
    # tensorboard_trace_handler's folder: "<worker_name>_<timestamp>_ascend_pt" (_profiler_path_creator.py)
    "trace_folder": "{}_{}_ascend_pt",
    "mstx": ("range_start", "range_end"),  # torch_npu.npu.mstx ranges around each phase
}

# torch.npu.memory functions the torch_memory profiler tool calls (torch_npu/npu/memory.py), with the keywords used.
TORCH_NPU_MEMORY = {"_record_memory_history": ("enabled", "max_entries", "stacks", "context"), "_dump_snapshot": ()}
# torch.npu.memory._set_allocator_settings("expandable_segments:<bool>") (npu_rl/device/npu_env.py), from 2.10
TORCH_NPU_ALLOCATOR_SETTINGS = ("_set_allocator_settings", "2.10.0")
# read by libtorch_npu when it loads (scripts/atlas/env.sh, npu_rl/device/npu_env.py); names found in the library
TORCH_NPU_NATIVE_VARIABLES = ("CPU_AFFINITY_CONF", "HCCL_BUFFSIZE", "PYTORCH_NPU_ALLOC_CONF", "TASK_QUEUE_ENABLE")

# ------------------------------------------------------------------------------------------------ vLLM-Ascend
VLLM_ASCEND_ENV = {"VLLM_ASCEND_ENABLE_NZ": "1"}  # variable -> default, in vllm_ascend/envs.py (before 0.27.1rc1)
VLLM_ASCEND_NZ_WAKE_UP_ERROR = "FRACTAL_NZ"  # in the ValueError NPUWorker.wake_up raises while NZ is on
# LLM(additional_config=...) keys npu_rl/device/npu_env.py sets -> the release from which AscendConfig reads them
# (older releases ignore unknown keys; 0.30's AscendConfig forbids them, and both are its fields)
VLLM_ASCEND_ADDITIONAL_CONFIG = {"weight_nz_mode": "0.20.2rc1", "enable_cpu_binding": "0.19.1rc1"}
VLLM_ASCEND_GET_CONFIG = "vllm_ascend.ascend_config.get_ascend_config"  # the weight-loading guard's effective value
VLLM_ASCEND_WORKER_METHODS = ("sleep", "wake_up", "load_model", "get_model")  # NPUWorker, every release checked
VLLM_ASCEND_WORKER_SIGNATURES = {"sleep": "(self, level=1)", "wake_up": "(self, tags=None)"}
VLLM_ASCEND_RUNNER_ATTRS = ("get_model",)  # NPUModelRunner: the load_weights path reads its model
VLLM_ASCEND_WORKER_FILES = ("vllm_ascend/worker/worker_v1.py", "vllm_ascend/worker/worker.py")
VLLM_ASCEND_RUNNER_FILE = "vllm_ascend/worker/model_runner_v1.py"

# ------------------------------------------------------------------------------------------------ triton-ascend
TRITON_ASCEND = {
    "module": "triton",  # the wheel installs the `triton` package (it replaces OpenAI's triton)
    "files": ("triton/backends/ascend/triton-adapter-opt", "triton/backends/ascend/compiler.py",
              "triton/backends/compiler.py", "triton/compiler/__init__.py"),
    "compile_api": ("triton.compile", "triton.compiler.ASTSource", "triton.backends.compiler.GPUTarget"),
    "target": ("npu", "Ascend910B3"),  # GPUTarget(backend, arch, warp_size) the kernels' tiles are chosen for
}


# ------------------------------------------------------------------------------------------------ msprobe
# npu_rl/trainer/profiling.py: PrecisionDebugger(config_path=...), set_init_step(step), start(), stop(), step()
MSPROBE = {"init_kwargs": ("config_path",), "methods": ("start", "stop", "step"), "base_methods": ("set_init_step",)}


@dataclass(frozen=True)
class Versions:
    """The real wheels the slow test downloads (from ``npu_rl/device/ascend_matrix.py``'s rows)."""

    torch_npu: tuple[str, ...] = ("2.7.1", "2.10.0.post4", "2.14.0")
    # aarch64 wheels (0.11.0 / 0.13.0 / 0.26.0rc1); 0.23.0.post1 and 0.30.0rc2 are sdists only on PyPI
    vllm_ascend: tuple[str, ...] = ("0.11.0", "0.13.0", "0.23.0.post1", "0.26.0rc1", "0.30.0rc2")
    triton_ascend: tuple[str, ...] = ("3.2.0",)
    mindstudio_probe: tuple[str, ...] = ("26.2.0",)


WHEELS = Versions()


_PARAM = re.compile(r"^\(\s*(?:[A-Za-z_]\w*\s*(?:=\s*(?:-?[\d.e-]+|'\w*'|None|True|False))?\s*,?\s*)*\)$")


def signature_from(text: str) -> inspect.Signature:
    """``inspect.Signature`` of ``"(a, b=1e-06, c='half', d=None)"`` (names and literal defaults only; anything
    else is refused, so a wheel's text is never executed as code)."""
    if not _PARAM.match(text):
        raise ValueError(f"not a plain parameter list: {text}")
    params = []
    for part in filter(None, (p.strip() for p in text[1:-1].split(","))):
        name, _, default = part.partition("=")
        value = ast.literal_eval(default.strip()) if default else inspect.Parameter.empty
        params.append(inspect.Parameter(name.strip(), inspect.Parameter.POSITIONAL_OR_KEYWORD, default=value))
    return inspect.Signature(params)


def signature(name: str) -> inspect.Signature:
    """The :data:`TORCH_NPU_SIGNATURES` entry as an ``inspect.Signature`` (for stand-ins and checks)."""
    return signature_from(TORCH_NPU_SIGNATURES[name])
