"""Ascend patches, applied once when the NPU backend is chosen.

What and why:

- ``torch.npu.set_compile_mode(jit_compile=False)``: use the pre-compiled operator binaries instead of compiling
  each new shape online; RL batches change shape every step and online compilation stalls for seconds.
- ``torch.npu.config.allow_internal_format = False``: keep ND tensor layouts, so that weights handed to the
  rollout engine and to checkpoints are plain tensors.
- Hugging Face Llama / Qwen2 / Qwen3 modules: RMSNorm through ``torch_npu.npu_rms_norm`` and rotary embeddings
  through ``torch_npu.npu_rotary_mul`` (fused kernels; the eager compositions launch 6-10 small operators each).
- ``TASK_QUEUE_ENABLE`` defaults to 1 (vllm-ascend's graph mode needs it; a user's own value is kept).

None of this has been run on Ascend hardware in this repository's CI (no NPU there); the selection and the
patching mechanism are tested with a stand-in ``torch_npu`` module (tests/test_device.py).
"""

from __future__ import annotations

import importlib
import logging
import os

import torch

logger = logging.getLogger(__name__)

_APPLIED = False

# (transformers module, RMSNorm class name) pairs that take the fused norm and rotary.
_HF_MODULES = (
    ("transformers.models.llama.modeling_llama", "LlamaRMSNorm"),
    ("transformers.models.qwen2.modeling_qwen2", "Qwen2RMSNorm"),
    ("transformers.models.qwen3.modeling_qwen3", "Qwen3RMSNorm"),
)


def _rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    import torch_npu

    if hidden_states.dtype != self.weight.dtype:
        hidden_states = hidden_states.to(self.weight.dtype)
    return torch_npu.npu_rms_norm(hidden_states, self.weight, epsilon=self.variance_epsilon)[0]


def _apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    import torch_npu

    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return torch_npu.npu_rotary_mul(q, cos, sin).to(q.dtype), torch_npu.npu_rotary_mul(k, cos, sin).to(k.dtype)


def patch_transformers() -> list[str]:
    """Swap in the fused NPU norm and rotary; returns the modules patched."""
    patched = []
    for module_name, norm_name in _HF_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        norm_cls = getattr(module, norm_name, None)
        if norm_cls is not None:
            norm_cls.forward = _rms_norm_forward
        if hasattr(module, "apply_rotary_pos_emb"):
            module.apply_rotary_pos_emb = _apply_rotary_pos_emb
        patched.append(module_name)
    return patched


def apply_once() -> None:
    """Apply every patch the first time it is called; later calls do nothing."""
    global _APPLIED
    if _APPLIED:
        return
    os.environ.setdefault("TASK_QUEUE_ENABLE", "1")
    npu = torch.npu
    if hasattr(npu, "set_compile_mode"):
        npu.set_compile_mode(jit_compile=False)
    config = getattr(npu, "config", None)
    if config is not None and hasattr(config, "allow_internal_format"):
        config.allow_internal_format = False
    if os.environ.get("NPU_RL_DISABLE_HF_PATCHES", "0") != "1":
        patched = patch_transformers()
        logger.info("NPU patches applied to %s", ", ".join(patched) or "no transformers modules")
    _APPLIED = True
