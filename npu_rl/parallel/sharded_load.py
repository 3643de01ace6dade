"""Weights read straight into FSDP2 shards: no rank ever holds the whole model.

The order, as torchtitan does it (``build on meta -> parallelize -> to_empty -> load``):

1. the model is built with its parameters on the meta device (no memory) and its buffers real
   (:func:`npu_rl.models.loader.load_causal_lm` with ``device="meta"``): buffers such as the rotary frequencies
   (``inv_freq``, non-persistent: in no checkpoint) are computed in the modules' constructors, so building them for
   real is both cheap and exactly what a plain load computes;
2. LoRA adapters may be added on top (their fresh values drawn as on one device, see ``models/lora.py``);
3. :func:`npu_rl.parallel.fsdp.apply_fsdp2` shards the meta model (a DTensor per parameter, still no memory);
4. :func:`load_sharded_weights` keeps every tensor that is already real (buffers, adapters), allocates this rank's
   shards with ``to_empty``, copies those real tensors back (each rank its own slice), and reads every other
   parameter's slice from the safetensors files with ``safe_open(...).get_slice(name)[rows]``: only the bytes of
   this rank's rows are read (the files are memory-mapped), converted to the parameter's dtype (a bf16 file into
   fp32 master weights is exact). Buffers stay as built unless a file holds them (a persistent buffer such as
   DeepSeek-V3's ``e_score_correction_bias``, read whole: FSDP2 does not shard buffers). Parameters that no file
   holds (a critic's fresh value head ``score``) are initialised by the model's own ``_init_weights``, as
   ``from_pretrained`` does, on a full host copy of the module drawn from ``seed`` (the global RNG is left as it
   was), so every rank holds slices of the same tensor. Expert-parallel experts (``parallel/expert_parallel.py``)
   are DTensors like any other: each rank reads the rows of its own experts only, from the per-expert tensors a
   Hugging Face MoE checkpoint stores (``parallel/expert_layout.py``).

verl broadcasts rank 0's full model instead (rank 0 still holds it whole, in host memory); reading slices needs no
collective and no rank-0 copy. Peak host memory per rank: its shards plus one parameter's slice in the file's dtype.

The files: ``model.safetensors``, or the shards named by ``model.safetensors.index.json`` (``weight_map``). A
folder without safetensors (``*.bin``, GGUF) is not read here: the caller keeps a plain load
(:func:`has_safetensors`). The embedded SmolLM2 is converted once to a safetensors folder, so it is read here too.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from npu_rl.parallel.expert_layout import read_stacked_slice, stacked_source

logger = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PEFT_PREFIX = "base_model.model."  # how a PEFT model names its base model's parameters
QWEN_VL_STORED = (("model.language_model.", "model."), ("model.visual.", "visual."))  # (in the model, in the file)


def has_safetensors(folder: str) -> bool:
    """Whether ``folder`` stores its weights as safetensors (one file or an index of shards)."""
    return any(os.path.isfile(os.path.join(folder, name)) for name in (SINGLE_FILE, INDEX_FILE))


@dataclass(frozen=True)
class CheckpointFiles:
    """Which safetensors file of ``folder`` holds each tensor name."""

    folder: str
    file_of: dict[str, str]  # tensor name -> file name inside folder

    @classmethod
    def of(cls, folder: str) -> CheckpointFiles:
        index = os.path.join(folder, INDEX_FILE)
        if os.path.isfile(index):
            with open(index) as f:
                weight_map = json.load(f).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"{index}: no 'weight_map' (tensor name -> file): not a safetensors index")
            missing = sorted({name for name in weight_map.values() if not os.path.isfile(os.path.join(folder, name))})
            if missing:
                raise FileNotFoundError(f"{index} names files that are not in {folder}: {', '.join(missing)}")
            return cls(folder, dict(weight_map))
        single = os.path.join(folder, SINGLE_FILE)
        if not os.path.isfile(single):
            raise FileNotFoundError(f"{folder} has neither {SINGLE_FILE} nor {INDEX_FILE}")
        from safetensors import safe_open

        with safe_open(single, framework="pt") as f:
            return cls(folder, {key: SINGLE_FILE for key in f.keys()})  # noqa: SIM118 (not a dict)

    def name_for(self, names: list[str], base_prefix: str) -> str | None:
        """The stored name of a parameter known by ``names`` (a tied parameter has several): its HF name (a PEFT
        wrapper's ``base_model.model.`` and ``.base_layer`` dropped) as is, or with the base model's prefix
        (``model.``) added or dropped (a bare ``Qwen2Model`` folder under a head, or back), or in the layout
        Qwen2-VL / Qwen2.5-VL checkpoints store (``model.layers.*`` for the model's ``model.language_model.layers.*``,
        ``visual.*`` for ``model.visual.*``: transformers renames them at load and back at save)."""
        for name in names:
            name = name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")
            candidates = [name] + [stored + name[len(ours):] for ours, stored in QWEN_VL_STORED
                                   if name.startswith(ours)]
            if base_prefix:
                prefix = base_prefix + "."
                candidates.append(name[len(prefix):] if name.startswith(prefix) else prefix + name)
            for candidate in candidates:
                if candidate in self.file_of:
                    return candidate
        return None


def local_slices(tensor: torch.Tensor) -> tuple[slice, ...]:
    """The index of this rank's part of a (DTensor) parameter in the full tensor; everything for a plain one."""
    if not isinstance(tensor, DTensor):
        return tuple(slice(0, size) for size in tensor.shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    return tuple(slice(o, o + s) for o, s in zip(offset, shape))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def real_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``model`` that is not on the meta device, by name (tied ones once)."""
    out = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        local = _local(tensor)
        if local.device.type != "meta":
            out[name] = tensor.detach()
    return out


@torch.no_grad()
def load_sharded_weights(model: nn.Module, folder: str, device: torch.device, *, seed: int = 0,
                         keep: dict[str, torch.Tensor] | None = None,
                         buffer_device: torch.device | None = None) -> dict[str, list[str]]:
    """Fill a parallelised meta model (see the module docstring) on ``device``: kept tensors copied back, the
    rest read from ``folder``'s safetensors, missing parameters initialised from ``seed``. ``keep`` are the real
    tensors taken by :func:`real_tensors` *before* sharding (full values); by default they are taken now, which is
    right for buffers (FSDP2 does not shard them) but not for real parameters that were sharded already.
    Buffers go to ``buffer_device`` (default ``device``; the compute device when the shards are offloaded to the
    host). Returns ``{"initialised": [...]}`` (names no file holds). Not collective: each rank reads its slices."""
    from safetensors import safe_open

    keep = real_tensors(model) if keep is None else keep
    files = CheckpointFiles.of(folder)
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model  # under a PEFT wrapper
    base_prefix = getattr(hf, "base_model_prefix", "") or ""
    names_of: dict[int, list[str]] = {}
    tensors: dict[int, torch.Tensor] = {}
    model.to_empty(device=device)
    _retie(model)
    for name, param in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(param), []).append(name)
        tensors[id(param)] = param
    model_type = getattr(getattr(hf, "config", None), "model_type", None)
    missing: list[tuple[str, torch.Tensor]] = []
    with ExitStack() as stack:
        handles: dict[str, object] = {}

        def get_slice(stored: str):
            file_name = files.file_of[stored]
            if file_name not in handles:
                handles[file_name] = stack.enter_context(
                    safe_open(os.path.join(files.folder, file_name), framework="pt", device="cpu"))
            return handles[file_name].get_slice(stored)

        for key, param in tensors.items():
            names = names_of[key]
            target = _local(param)
            index = local_slices(param)
            kept = next((keep[n] for n in names if n in keep), None)
            if kept is not None:
                target.copy_(_local(kept)[index] if not isinstance(kept, DTensor) else _local(kept))
                continue
            stored = files.name_for(names, base_prefix)
            if stored is None:
                stacked = stacked_source(names[0], param.shape[0], model_type,
                                         lambda n: files.name_for([n], base_prefix)) if param.ndim == 3 else None
                if stacked is None:
                    missing.append((names[0], param))
                else:  # per-expert tensors in the file, stacked experts in the model (expert_layout.py)
                    target.copy_(read_stacked_slice(stacked, index, tuple(param.shape), get_slice, target.dtype))
                continue
            tensor_slice = get_slice(stored)
            shape = tuple(tensor_slice.get_shape())
            if shape != tuple(param.shape):
                raise ValueError(f"{os.path.join(folder, files.file_of[stored])}: {stored!r} has shape {list(shape)}, "
                                 f"the model ({type(model).__name__}) needs {list(param.shape)}: config.json and "
                                 "weights disagree")
            piece = tensor_slice[index] if target.numel() else torch.empty(target.shape)
            if piece.is_floating_point() and not bool(torch.isfinite(piece).all()):  # on the host: no device sync
                raise ValueError(f"{os.path.join(folder, files.file_of[stored])}: {stored!r} holds NaN or infinite "
                                 "values: the model's weights are not usable (a corrupt or diverged model)")
            target.copy_(piece)
        modules = dict(model.named_modules())
        for name, _ in list(model.named_buffers()):
            module_name, _, attr = name.rpartition(".")
            if name not in keep:
                raise ValueError(f"{type(model).__name__}: buffer {name!r} was built on the meta device; build the "
                                 "model with its buffers real (models.loader.load_causal_lm(device='meta') does)")
            value = keep[name]
            stored = files.name_for([name], base_prefix)
            if stored is not None:  # a persistent buffer the checkpoint holds (DeepSeek-V3's e_score_correction_bias)
                value = get_slice(stored)[:].to(value.dtype)
            modules[module_name]._buffers[attr] = value.to(buffer_device or device)
    if missing:
        _initialise_missing(model, missing, seed)
    return {"initialised": [name for name, _ in missing]}


def _retie(model: nn.Module) -> None:
    """``to_empty`` gives each module its own new parameter, so tied embeddings must be tied again."""
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False) and hasattr(model, "tie_weights"):
        model.tie_weights()


def _initialise_missing(model: nn.Module, missing: list[tuple[str, torch.Tensor]], seed: int) -> None:
    """Parameters no file holds, initialised as ``from_pretrained`` initialises them (the model's
    ``_init_weights`` on the owning module), on a full host copy built per module, seeded; this rank keeps its
    slice."""
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    init = getattr(hf, "_init_weights", None)
    if init is None:
        raise ValueError(f"{type(model).__name__}: {', '.join(n for n, _ in missing)} are in no weights file and "
                         "the model has no _init_weights to initialise them")
    logger.warning("weights not in the checkpoint, initialised fresh: %s", ", ".join(n for n, _ in missing))
    modules = dict(model.named_modules())
    owners: dict[str, list[tuple[str, torch.Tensor]]] = {}
    for name, param in missing:
        module_name, _, attr = name.rpartition(".")
        owners.setdefault(module_name, []).append((attr, param))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for module_name, params in owners.items():
            host = _host_copy(modules[module_name])
            init(host)
            for attr, param in params:
                _local(param).copy_(getattr(host, attr)[local_slices(param)])


def _host_copy(module: nn.Module) -> nn.Module:
    """A full-size host module of the same kind (its own parameters, empty) for ``_init_weights`` to fill."""
    import copy

    host = copy.copy(module)  # shallow: children are not needed by _init_weights of this module's own weights
    host._parameters = {}
    host._buffers = {}
    host._modules = {}
    for attr, param in module._parameters.items():  # a None entry (Linear without bias) stays None
        host._parameters[attr] = None if param is None else nn.Parameter(
            torch.empty(param.shape, dtype=param.dtype), requires_grad=False)
    return host
