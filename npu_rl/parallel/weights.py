"""Full weights out of a sharded model: for the rollout engine's weight sync and for Hugging Face folders.

- :func:`iter_full_parameters` yields ``(HF name, full tensor)`` one tensor at a time (``DTensor.full_tensor()``
  per parameter), so a rollout engine can load a 7B model's weights without a second full copy ever existing on
  the device: peak extra memory is one parameter. Names are the HF state-dict names (FSDP2 does not rename);
  a tied ``lm_head.weight`` is skipped by default (vLLM and ``save_pretrained`` re-tie it).
- :func:`export_hf_folder` gathers the full state dict on rank 0 (host memory) and writes a folder that
  ``from_pretrained`` loads; :func:`save_hf_state_dict` is the part shared with the checkpoint merger.

Both are collective on a sharded model: every rank must run them to the end, in step.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from npu_rl.device import get_backend
from npu_rl.parallel.dist import is_distributed, rank


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a DTensor (collective), or ``tensor`` itself. Shards offloaded to the host
    (``param_offload``) are first copied to the device, since the accelerator's collectives need device memory."""
    if not isinstance(tensor, DTensor):
        return tensor
    local = tensor.to_local()
    device = get_backend().device()
    if local.device.type != device.type:
        tensor = DTensor.from_local(local.to(device), tensor.device_mesh, tensor.placements, run_check=False,
                                    shape=tensor.shape, stride=tensor.stride())
    return tensor.full_tensor()


def iter_full_parameters(model: nn.Module, *, dtype: torch.dtype | None = None,
                         device: torch.device | str | None = None,
                         include_tied: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` for every parameter and persistent buffer of ``model`` (sharded or not), in
    state-dict order. ``dtype`` casts floating tensors (e.g. bf16 for the rollout engine); ``device`` moves the
    result (e.g. ``"cpu"``). A tensor that needs no gather, cast or move is yielded as is (it shares storage with
    the model: copy it if you keep it across an update). Do not call it in the middle of a forward/backward."""
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen and not include_tied:
            continue
        seen.add(id(tensor))
        full = full_tensor(tensor.detach())
        if dtype is not None and full.is_floating_point():
            full = full.to(dtype)
        if device is not None:
            full = full.to(device)
        yield name, full


def hf_model_class(model: nn.Module) -> type:
    """The Hugging Face class of ``model``, seen through FSDP2's dynamic ``FSDP<Class>`` subclass."""
    from torch.distributed.fsdp import FSDPModule
    from transformers import PreTrainedModel

    for cls in type(model).__mro__:
        if issubclass(cls, PreTrainedModel) and not issubclass(cls, FSDPModule):
            return cls
    raise TypeError(f"{type(model).__name__} is not a Hugging Face PreTrainedModel")


def hf_class_from_config(config: Any) -> type:
    import transformers

    architectures = getattr(config, "architectures", None) or []
    for name in architectures:  # a name from a file: only a transformers model class is taken, nothing else it exports
        cls = getattr(transformers, str(name), None) if str(name).isidentifier() else None
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
            return cls
    raise ValueError(f"cannot tell the model class from config.architectures={architectures} (expected a "
                     "transformers model class name, e.g. Qwen2ForCausalLM)")


def save_hf_state_dict(config: Any, state_dict: dict[str, torch.Tensor], out_dir: str, *,
                       model_class: type | None = None, tokenizer: Any = None) -> str:
    """Write ``state_dict`` (full tensors) as an HF folder: a model skeleton on the meta device takes the tensors
    without copying (``assign=True``), tied weights are re-tied, then ``save_pretrained``."""
    model_class = model_class or hf_class_from_config(config)
    with torch.device("meta"):
        skeleton = model_class._from_config(config)
    result = skeleton.load_state_dict(state_dict, strict=False, assign=True)
    if result.unexpected_keys:
        raise ValueError(f"state dict keys not in {model_class.__name__}: {result.unexpected_keys[:5]}")
    skeleton.tie_weights()
    still_meta = [n for n, p in skeleton.named_parameters() if p.is_meta]
    if still_meta:
        raise ValueError(f"state dict lacks {still_meta[:5]} for {model_class.__name__}")
    dtypes = {t.dtype for t in state_dict.values() if t.is_floating_point()}
    if len(dtypes) == 1:
        skeleton.config.dtype = dtypes.pop()
    os.makedirs(out_dir, exist_ok=True)
    skeleton.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir


def export_hf_folder(model: nn.Module, out_dir: str, *, tokenizer: Any = None,
                     dtype: torch.dtype | None = None) -> str:
    """Save a (sharded) HF model as a ``from_pretrained``-loadable folder, written by rank 0. Collective."""
    is_writer = rank() == 0
    state_dict = {}
    for name, tensor in iter_full_parameters(model, dtype=dtype):
        if is_writer:
            state_dict[name] = tensor.to("cpu")
    if is_writer:
        save_hf_state_dict(model.config, state_dict, out_dir, model_class=hf_model_class(model), tokenizer=tokenizer)
    if is_distributed():
        dist.barrier()
    return out_dir
