"""Ascend patches, applied once when the NPU backend is chosen.

What and why:

- ``torch.npu.set_compile_mode(jit_compile=False)``: use the pre-compiled operator binaries instead of compiling
  each new shape online; RL batches change shape every step and online compilation stalls for seconds.
- ``torch.npu.config.allow_internal_format = False``: keep ND tensor layouts, so that weights handed to the
  rollout engine and to checkpoints are plain tensors.
- Hugging Face Llama / Qwen2 / Qwen3 modules: RMSNorm through ``torch_npu.npu_rms_norm``, rotary embeddings
  through ``torch_npu.npu_rotary_mul`` and the MLP's SwiGLU (``silu(gate) * up``) through ``torch_npu.npu_swiglu``
  on the concatenated projections (fused kernels; the eager compositions launch several small operators each).
  These are the training forwards (actor, reference, critic); the rollout engine (vLLM-Ascend) has its own. The MLP
  patch applies only where the model's activation is SiLU (``config.hidden_act == "silu"``); others run as written.
- Mixture-of-experts layers: transformers' ``grouped_mm`` experts implementation through torch_npu's grouped
  matmuls (``npu_rl/device/npu_experts.py``; ``NPU_RL_NPU_GROUPED_MM=0`` keeps transformers' own).

``TASK_QUEUE_ENABLE`` is not set here: torch_npu reads it when it is imported, before any patch can run
(``npu_rl/device/npu_env.py``). :func:`apply_once` returns a report of what each patch replaced, checked after the
fact (a transformers release that renames a class or stops looking the rotary function up by name shows as "not
applied", with the reason, instead of silently running the eager code).

None of this has been run on Ascend hardware in this repository's CI (no NPU there); the selection and the
patching mechanism are tested with a stand-in ``torch_npu`` module (tests/device/test_device.py).
"""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass

import torch

from npu_rl.device import npu_experts

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


def _swiglu_mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    """``down(silu(gate(x)) * up(x))`` with the fused op: npu_swiglu(t, dim=-1) = silu(first half) * second half."""
    if getattr(self.config, "hidden_act", "silu") != "silu":
        return _EAGER_MLP[type(self)](self, x)
    import torch_npu

    return self.down_proj(torch_npu.npu_swiglu(torch.cat((self.gate_proj(x), self.up_proj(x)), dim=-1), dim=-1))


_MLP_CLASSES = {  # the MLP classes whose forward is silu(gate) * up
    "transformers.models.llama.modeling_llama": "LlamaMLP",
    "transformers.models.qwen2.modeling_qwen2": "Qwen2MLP",
    "transformers.models.qwen3.modeling_qwen3": "Qwen3MLP",
}
_EAGER_MLP: dict[type, object] = {}  # class -> its own forward, for activations other than SiLU


_ATTENTION_CLASSES = {  # the attention class whose forward must look up apply_rotary_pos_emb by name
    "transformers.models.llama.modeling_llama": "LlamaAttention",
    "transformers.models.qwen2.modeling_qwen2": "Qwen2Attention",
    "transformers.models.qwen3.modeling_qwen3": "Qwen3Attention",
}


@dataclass
class PatchResult:
    target: str  # what the patch replaces, e.g. "transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm.forward"
    applied: bool
    why: str = ""  # when not applied: what was found instead


def _check_rotary_lookup(module, module_name: str) -> str:
    """'' when the module's attention forward calls ``apply_rotary_pos_emb`` through the module global (so replacing
    the global reaches it), else why not."""
    attn = getattr(module, _ATTENTION_CLASSES.get(module_name, ""), None)
    if attn is None:
        return f"no {_ATTENTION_CLASSES.get(module_name)} class"
    code = getattr(attn.forward, "__code__", None)
    if code is None or "apply_rotary_pos_emb" not in code.co_names:
        return f"{attn.__name__}.forward does not look up apply_rotary_pos_emb by name"
    return ""


def patch_transformers() -> list[PatchResult]:
    """Swap in the fused NPU norm and rotary; returns, per target, whether the replacement is in place."""
    results = []
    for module_name, norm_name in _HF_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            results.append(PatchResult(module_name, False, f"not importable ({exc})"))
            continue
        norm_cls = getattr(module, norm_name, None)
        target = f"{module_name}.{norm_name}.forward"
        if norm_cls is None:
            results.append(PatchResult(target, False, f"{module_name} has no {norm_name}"))
        else:
            norm_cls.forward = _rms_norm_forward
            ok = norm_cls.forward is _rms_norm_forward and norm_cls.__call__ is torch.nn.Module.__call__
            results.append(PatchResult(target, ok, "" if ok else f"{norm_name}.__call__ is overridden"))
        mlp_name = _MLP_CLASSES.get(module_name)
        mlp_cls = getattr(module, mlp_name, None) if mlp_name else None
        target = f"{module_name}.{mlp_name}.forward"
        if mlp_cls is None:
            results.append(PatchResult(target, False, f"{module_name} has no {mlp_name}"))
        elif not all(n in mlp_cls.forward.__code__.co_names for n in ("gate_proj", "up_proj", "act_fn")) and \
                mlp_cls.forward is not _swiglu_mlp_forward:
            results.append(PatchResult(target, False, f"{mlp_name}.forward is not down(act(gate) * up)"))
        else:
            if mlp_cls.forward is not _swiglu_mlp_forward:
                _EAGER_MLP[mlp_cls] = mlp_cls.forward
            mlp_cls.forward = _swiglu_mlp_forward
            results.append(PatchResult(target, True))
        target = f"{module_name}.apply_rotary_pos_emb"
        if not hasattr(module, "apply_rotary_pos_emb"):
            results.append(PatchResult(target, False, "no apply_rotary_pos_emb in the module"))
            continue
        module.apply_rotary_pos_emb = _apply_rotary_pos_emb
        why = _check_rotary_lookup(module, module_name)
        results.append(PatchResult(target, module.apply_rotary_pos_emb is _apply_rotary_pos_emb and not why, why))
    return results


def _device_settings() -> list[PatchResult]:
    npu = torch.npu
    results = []
    if hasattr(npu, "set_compile_mode"):
        npu.set_compile_mode(jit_compile=False)
        results.append(PatchResult("torch.npu.set_compile_mode(jit_compile=False)", True))
    else:
        results.append(PatchResult("torch.npu.set_compile_mode(jit_compile=False)", False,
                                   "torch.npu has no set_compile_mode"))
    # torch_npu's config object defines only __setattr__ (hasattr(config, "allow_internal_format") is False on the
    # real package): assign without asking.
    config = getattr(npu, "config", None)
    if config is None:
        results.append(PatchResult("torch.npu.config.allow_internal_format = False", False, "no torch.npu.config"))
    else:
        config.allow_internal_format = False
        results.append(PatchResult("torch.npu.config.allow_internal_format = False", True))
    return results


REPORT: list[PatchResult] = []


def apply_once() -> list[PatchResult]:
    """Apply every patch the first time it is called (later calls return the first report); logs what did not
    take."""
    global _APPLIED
    if _APPLIED:
        return REPORT
    results = _device_settings()
    if os.environ.get("NPU_RL_DISABLE_HF_PATCHES", "0") != "1":
        results += patch_transformers()
    installed, why = npu_experts.install()
    results.append(PatchResult("transformers.integrations.moe grouped_mm experts (torch_npu grouped matmuls)",
                               installed, why))
    REPORT[:] = results
    missed = [r for r in results if not r.applied]
    logger.info("NPU patches: %d applied, %d not", len(results) - len(missed), len(missed))
    for r in missed:
        logger.warning("NPU patch not applied: %s (%s)", r.target, r.why)
    _APPLIED = True
    return REPORT
