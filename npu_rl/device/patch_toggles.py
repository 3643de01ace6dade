"""Turn one NPU patch off at a time, for ``npu-rl doctor --parity`` (which patch moves the rollout/actor gap?).

:func:`patch_variants` returns ``(name, context manager)`` pairs; inside each context one patch of
:mod:`npu_rl.device.npu_patches` is undone and the plain computation is back:

- ``rms_norm``: the Hugging Face RMSNorm (variance in float32, ``weight * x.to(input dtype)``) instead of
  ``torch_npu.npu_rms_norm``;
- ``rotary``: ``q cos + rotate_half(q) sin`` instead of ``torch_npu.npu_rotary_mul``;
- ``swiglu``: the MLP's own ``down(act(gate) * up)`` instead of ``torch_npu.npu_swiglu``;
- ``internal_format``: ``torch.npu.config.allow_internal_format = True`` (the patch sets False). It only changes the
  layout of tensors created inside the context (activations), not of weights already loaded.
- ``grouped_mm``: transformers' own ``grouped_mm`` experts (``torch._grouped_mm``) instead of torch_npu's grouped
  matmuls (MoE models).

On any other device the list is empty. NEVER RUN ON AN NPU: written against torch_npu's documented API and the
patch module's own code; on CPU only the empty list and the context managers' save/restore run (tests/device/test_device.py
style stand-ins are not used here).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator

import torch

from npu_rl.device import npu_experts
from npu_rl.device.npu_patches import _EAGER_MLP, _HF_MODULES, _MLP_CLASSES


def _eager_rms_norm(self, hidden_states: torch.Tensor) -> torch.Tensor:
    input_dtype = hidden_states.dtype
    hidden = hidden_states.to(torch.float32)
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * hidden.to(input_dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _eager_rotary(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


@contextlib.contextmanager
def _swap(targets: list[tuple[object, str, object]]) -> Iterator[None]:
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]
    try:
        for owner, name, value in targets:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def _hf_targets(kind: str) -> list[tuple[object, str, object]]:
    targets = []
    for module_name, norm_name in _HF_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if kind == "rms_norm" and hasattr(module, norm_name):
            targets.append((getattr(module, norm_name), "forward", _eager_rms_norm))
        if kind == "rotary" and hasattr(module, "apply_rotary_pos_emb"):
            targets.append((module, "apply_rotary_pos_emb", _eager_rotary))
        mlp = getattr(module, _MLP_CLASSES.get(module_name, ""), None)
        if kind == "swiglu" and mlp in _EAGER_MLP:
            targets.append((mlp, "forward", _EAGER_MLP[mlp]))
    return targets


@contextlib.contextmanager
def _transformers_grouped_mm() -> Iterator[None]:
    npu_experts.uninstall()
    try:
        yield
    finally:
        npu_experts.install()


@contextlib.contextmanager
def _internal_format_on() -> Iterator[None]:
    config = torch.npu.config
    before = getattr(config, "allow_internal_format", False)
    config.allow_internal_format = True
    try:
        yield
    finally:
        config.allow_internal_format = before


def patch_variants(device_name: str) -> list[tuple[str, Callable[[], contextlib.AbstractContextManager]]]:
    """``(patch name, factory of a context manager that undoes it)``; empty unless ``device_name`` is the NPU's."""
    if device_name != "npu":
        return []
    return [
        ("rms_norm", lambda: _swap(_hf_targets("rms_norm"))),
        ("rotary", lambda: _swap(_hf_targets("rotary"))),
        ("swiglu", lambda: _swap(_hf_targets("swiglu"))),
        ("internal_format", _internal_format_on),
        ("grouped_mm", _transformers_grouped_mm),
    ]
