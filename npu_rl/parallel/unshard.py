"""Gather an FSDP2 model's full parameters once, run many forwards with them, then shard again.

A sharded module all-gathers every layer at the start of every forward and frees it after (with
``reshard_after_forward``). For one training forward that is the point; for autoregressive generation it means one
all-gather of the whole model per decoded token, and every rank must run the same number of forward passes
(``synced_gpus``). :func:`unsharded` instead issues one all-gather per FSDP group on entry (all in flight at once),
turns ``reshard_after_forward`` off so the forwards inside reuse the gathered weights, and on exit frees them and
restores each group's setting. Inside the block the forwards do no collective, so ranks generate independently.

Memory: the full model in the gather dtype (``mixed_precision.param_dtype``, bf16 by default) on every rank for the
duration of the block, on top of the shards (a 0.5B model: ~1 GiB; 7B: ~15 GiB). The gathered bytes are returned in
the stats, and the device's allocated memory before / inside is measured.

verl does the same before its rollout (``summon_full_params`` in FSDP1, a full state dict in FSDP2) and then
hands the weights to vLLM; here the HF engine generates with the very module the actor trains.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from npu_rl.device import get_backend


@dataclass
class UnshardStats:
    gathered: bool = False  # False: the model is not sharded (nothing done)
    gathered_gb: float = 0.0  # bytes of the full parameters held during the block
    gather_s: float = 0.0
    release_s: float = 0.0
    memory_before_gb: float = 0.0
    memory_inside_gb: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def as_metrics(self, prefix: str = "rollout") -> dict[str, float]:
        if not self.gathered:
            return {}
        return {f"timing_s/{prefix}_unshard": self.gather_s, f"timing_s/{prefix}_reshard": self.release_s,
                f"{prefix}/unshard_gathered_gb": self.gathered_gb,
                f"{prefix}/unshard_mem_allocated_before_gb": self.memory_before_gb,
                f"{prefix}/unshard_mem_allocated_inside_gb": self.memory_inside_gb}


def _fsdp_modules(model: nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _reshards_after_forward(module: FSDPModule) -> bool:
    group = module._get_fsdp_state()._fsdp_param_group  # None for a module that owns no parameters
    return group is not None and group.post_forward_mesh_info is not None


def _allocated_gb() -> float:
    backend = get_backend()
    return backend.module.memory_allocated() / 1024**3 if backend.is_accelerator else 0.0


@contextmanager
def unsharded(model: nn.Module):
    """Hold ``model``'s full parameters for the block (collective on entry and exit; see the module docstring).
    Yields an :class:`UnshardStats`; a model with no FSDP2 groups passes through untouched (``gathered=False``)."""
    modules = _fsdp_modules(model)
    stats = UnshardStats()
    if not modules:
        yield stats
        return
    backend = get_backend()
    stats.memory_before_gb = _allocated_gb()
    start = time.perf_counter()
    settings = [_reshards_after_forward(m) for m in modules]
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
    handles = [module.unshard(async_op=True) for module in modules]
    for handle in handles:
        if handle is not None:
            handle.wait()
    backend.synchronize()
    stats.gather_s = time.perf_counter() - start
    stats.gathered = True
    stats.gathered_gb = sum(p.numel() * p.element_size() for p in _full_parameters(modules)) / 1024**3
    stats.memory_inside_gb = _allocated_gb()
    try:
        yield stats
    finally:
        start = time.perf_counter()
        for module, setting in zip(modules, settings):
            module.reshard()
            module.set_reshard_after_forward(setting, recurse=False)
        backend.synchronize()
        stats.release_s = time.perf_counter() - start


def _full_parameters(modules: list[FSDPModule]):
    """The unsharded parameter tensors the groups hold right now."""
    for module in modules:
        group = module._get_fsdp_state()._fsdp_param_group
        if group is None:
            continue
        for fsdp_param in group.fsdp_params:
            yield fsdp_param.unsharded_param


def is_sharded(model: nn.Module) -> bool:
    return bool(_fsdp_modules(model))


def unsharded_parameter_bytes(model: nn.Module, dtype: torch.dtype | None = None) -> int:
    """Bytes the full parameters take in ``dtype`` (default: their own): what :func:`unsharded` will hold."""
    total = 0
    for param in model.parameters():
        size = dtype.itemsize if dtype is not None else param.element_size()
        total += param.numel() * size  # a DTensor's numel() is its global size
    return total


class PlainView:
    """A hook-free twin of a sharded model for many forwards on gathered weights (generation).

    Even with its weights gathered, an FSDP2 module runs its pre/post-forward hooks in every layer at every decoded
    token (stream waits, parameter swaps: Python work per layer per token, ~2.5 s over 256 tokens of a 24-layer
    model). The twin is the same architecture built once on the meta device (no memory); :meth:`bind` points its
    parameters and buffers at the gathered tensors of the sharded model (inside :func:`unsharded`; no copy), and
    :meth:`release` drops those references again before the gathered weights are freed. Expert-parallel experts
    (``parallel/expert_parallel.py``) are gathered over the ep ranks in :meth:`bind` (a copy, collective), so
    the twin computes every expert locally and the ranks decode independently.
    """

    def __init__(self, model: nn.Module):
        import copy

        with torch.device("meta"):
            self.module = type(model)(copy.deepcopy(model.config))
        self.module.eval()
        self.module.requires_grad_(False)
        if getattr(model, "generation_config", None) is not None:
            self.module.generation_config = copy.deepcopy(model.generation_config)

    @staticmethod
    def _slot(root: nn.Module, name: str) -> tuple[nn.Module, str]:
        owner, _, attr = name.rpartition(".")
        return root.get_submodule(owner) if owner else root, attr

    def bind(self, model: nn.Module) -> nn.Module:
        """Alias ``model``'s current (gathered) parameters and buffers; return the twin."""
        for name, param in model.named_parameters(remove_duplicate=False):
            if isinstance(param, DTensor):
                source, _ = self._slot(model, name)
                if getattr(source, "_npu_rl_ep", None) is None:
                    raise RuntimeError(f"PlainView.bind: {name} is still sharded; bind inside unsharded(model)")
                # Expert parallelism: FSDP gathered this rank's experts only; the twin (model.config's own experts
                # implementation, no all-to-all) needs all of them, so each rank decodes on its own. Collective.
                param = param.full_tensor()
            owner, attr = self._slot(self.module, name)
            owner._parameters[attr] = param
        for name, buffer in model.named_buffers(remove_duplicate=False):
            owner, attr = self._slot(self.module, name)
            owner._buffers[attr] = buffer
        for (name, twin), source in zip(self.module.named_modules(), model.modules()):
            for attr, value in vars(source).items():  # plain tensor attributes (e.g. rotary original_inv_freq)
                if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter) and attr in vars(twin):
                    setattr(twin, attr, value)
        left = [n for n, p in self.module.named_parameters() if p.is_meta]
        if left:
            raise RuntimeError(f"PlainView.bind: no gathered tensor for {left[:3]} ({type(model).__name__})")
        return self.module

    def release(self) -> None:
        """Point every parameter and buffer back at an empty meta tensor (the gathered weights can be freed)."""
        for module in self.module.modules():
            for attr, param in module._parameters.items():
                if param is not None:
                    module._parameters[attr] = nn.Parameter(torch.empty_like(param, device="meta"),
                                                            requires_grad=False)
            for attr, buffer in module._buffers.items():
                if buffer is not None:
                    module._buffers[attr] = torch.empty_like(buffer, device="meta")
