"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP), and merging them into an HF folder.

Layout of one checkpoint folder (e.g. ``.../global_step_10/actor``)::

    model_optim/     DCP files: {"model": ..., "optimizer": ...}, each rank writing its own shards
    huggingface/     config.json (+ generation config, tokenizer when given): what the merger needs
    extra/rank_<r>.pt  per-rank Python state (lr scheduler, RNG, data loader position ...), safe_load.save_state
    manifest.json    size and SHA-256 of every file above, written by rank 0 when the save completed

DCP stores every tensor with its global shape, so a checkpoint saved by N ranks loads on M ranks (any mesh, FSDP2
or a plain unsharded model) and :func:`merge_checkpoint` reads it without any process group. The optimizer state
dict is keyed by parameter name (``get_state_dict``), so it reshards too.

Loading runs no code from the folder: the manifest is checked first (a missing or truncated file is named), DCP's
``.metadata`` pickle goes through an allow-list unpickler, its non-tensor items load with ``weights_only=True``, and
the per-rank extra is plain containers + tensors (``npu_rl.utils.safe_load``).
"""

from __future__ import annotations

import copy
import glob
import io
import os
import shutil
import warnings
from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from npu_rl.parallel.dist import is_distributed
from npu_rl.parallel.dist import rank as dist_rank
from npu_rl.parallel.manifest import verify_manifest, write_manifest
from npu_rl.parallel.weights import hf_class_from_config, hf_model_class, save_hf_state_dict
from npu_rl.utils.safe_load import CorruptFileError, UnsafeFileError, load_state, restricted_unpickle, save_state

MODEL_OPTIM_DIR = "model_optim"
HF_DIR = "huggingface"
EXTRA_DIR = "extra"


def _barrier() -> None:
    if is_distributed():
        dist.barrier()


class SafeFileSystemReader(dcp.FileSystemReader):
    """DCP's reader with ``.metadata`` loaded by an allow-list unpickler (DCP's own uses ``pickle.load``)."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        metadata = restricted_unpickle(os.path.join(str(self.path), name))
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(dcp.DefaultLoadPlanner):
    """DCP's planner with non-tensor items loaded by ``torch.load(weights_only=True)`` (DCP's own: False)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
        except Exception as exc:
            raise UnsafeFileError(f"checkpoint item {fqn!r} was not loaded: it needs more than plain values and "
                                  f"tensors to load ({str(exc).split('.')[0]}); a crafted or foreign file") from None
        clean = io.BytesIO()  # what is left is plain data: hand it to DCP's own placement
        torch.save(obj, clean)
        clean.seek(0)
        super().load_bytes(read_item, clean)


def _dcp_load(state: dict[str, Any], dcp_dir: str, **kwargs: Any) -> None:
    restricted_unpickle(os.path.join(dcp_dir, ".metadata"))  # refused or corrupt: said plainly, before DCP wraps it
    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(dcp_dir), planner=SafeLoadPlanner(), **kwargs)
    except CorruptFileError:
        raise
    except (Exception, CheckpointException) as exc:  # DCP's own is a BaseException
        cause = _root_cause(exc)
        if isinstance(cause, CorruptFileError):
            raise cause from None
        raise CorruptFileError(f"{dcp_dir}: loading the sharded checkpoint failed ({type(cause).__name__}: "
                               f"{cause})") from exc


def _root_cause(exc: BaseException) -> BaseException:
    """DCP wraps a rank's error in CheckpointException({rank: (exc, traceback)}): the first underlying one."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        return _root_cause(first[0] if isinstance(first, tuple) else first)
    return exc


def _options(trainable_only: bool) -> StateDictOptions:
    """``trainable_only``: the parameters that train (a LoRA adapter), not the frozen base."""
    return StateDictOptions(ignore_frozen_params=trainable_only, strict=not trainable_only)


def _model_state(model: nn.Module, optimizers: list, trainable_only: bool):
    model_sd, optim_sd = get_state_dict(model, optimizers, options=_options(trainable_only))
    if trainable_only:  # a frozen tied weight (lm_head = embed_tokens) slips through ignore_frozen_params
        trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        model_sd = {k: v for k, v in model_sd.items() if k in trainable}
    return model_sd, optim_sd


def _hf_model(model: nn.Module) -> nn.Module:
    """The HF model inside a PEFT wrapper (the model itself otherwise)."""
    return model.get_base_model() if hasattr(model, "peft_config") else model


# a vision-language model's processor files, copied from its folder into a checkpoint and from there into a merge
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")


def save_checkpoint(path: str, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                    extra: dict[str, Any] | None = None, tokenizer: Any = None, trainable_only: bool = False,
                    hf_files: Sequence[str] = ()) -> str:
    """Save model (+ optimizer) shards, the HF config (+ tokenizer, + ``hf_files`` copied beside it: a vision
    model's preprocessor_config.json) and this rank's ``extra``. Collective.
    ``trainable_only``: only parameters with ``requires_grad`` (and their optimizer states)."""
    optimizers = [optimizer] if optimizer is not None else []
    model_sd, optim_sd = _model_state(model, optimizers, trainable_only)
    state = {"model": model_sd}
    if optimizer is not None:
        state["optimizer"] = optim_sd
    dcp.save(state, checkpoint_id=os.path.join(path, MODEL_OPTIM_DIR))
    rank = dist_rank()
    if rank == 0:
        hf_dir = os.path.join(path, HF_DIR)
        os.makedirs(hf_dir, exist_ok=True)
        hf = _hf_model(model)
        config = copy.deepcopy(hf.config)
        config.architectures = [hf_model_class(hf).__name__]  # what the merger rebuilds
        config.save_pretrained(hf_dir)
        if getattr(hf, "generation_config", None) is not None:
            hf.generation_config.save_pretrained(hf_dir)
        if tokenizer is not None:
            tokenizer.save_pretrained(hf_dir)
        for file in hf_files:
            shutil.copyfile(file, os.path.join(hf_dir, os.path.basename(file)))
    if extra is not None:
        os.makedirs(os.path.join(path, EXTRA_DIR), exist_ok=True)
        save_state(extra, os.path.join(path, EXTRA_DIR, f"rank_{rank}.pt"))
    _barrier()
    if rank == 0:  # every rank's files are written: record them
        write_manifest(path)
    _barrier()
    return path


def load_checkpoint(path: str, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                    load_optimizer: bool = True, trainable_only: bool = False) -> dict[str, Any] | None:
    """Load into ``model`` (+ ``optimizer``) whatever their sharding; return this rank's ``extra`` (rank 0's
    when the checkpoint had fewer ranks), or None. Collective."""
    if not os.path.isdir(os.path.join(path, MODEL_OPTIM_DIR)):
        raise FileNotFoundError(f"{path!r} is not a checkpoint folder (no {MODEL_OPTIM_DIR}/ inside)")
    verify_manifest(path, deep=False)  # present and whole (sizes); the driver checked the hashes before resuming
    with_optim = optimizer is not None and load_optimizer
    optimizers = [optimizer] if with_optim else []
    options = _options(trainable_only)
    model_sd, optim_sd = _model_state(model, optimizers, trainable_only)  # creates the optimizer's state too
    state = {"model": model_sd}
    if with_optim:
        state["optimizer"] = optim_sd
    _dcp_load(state, os.path.join(path, MODEL_OPTIM_DIR))
    set_state_dict(model, optimizers, model_state_dict=state["model"], optim_state_dict=state.get("optimizer", {}),
                   options=options)
    return _load_extra(path)


def _load_extra(path: str) -> dict[str, Any] | None:
    for name in (f"rank_{dist_rank()}.pt", "rank_0.pt"):
        file = os.path.join(path, EXTRA_DIR, name)
        if os.path.isfile(file):
            return load_state(file)
    return None


def merge_checkpoint(path: str, out_dir: str, *, dtype: torch.dtype | None = None) -> str:
    """Merge a sharded checkpoint into a plain HF folder (``npu-rl merge``). One process, no process group, host
    memory for one full model. ``dtype`` casts the weights (default: as saved)."""
    from transformers import AutoConfig, AutoTokenizer

    hf_dir = os.path.join(path, HF_DIR)
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        raise FileNotFoundError(f"{path!r}: no {HF_DIR}/config.json: not a checkpoint written by save_checkpoint")
    verify_manifest(path)  # every file whole before any is read
    config = AutoConfig.from_pretrained(hf_dir)
    model_class = hf_class_from_config(config)
    with torch.device("meta"):
        skeleton = model_class._from_config(config)
    state_dict = _state_dict_from_metadata(os.path.join(path, MODEL_OPTIM_DIR), skeleton)
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        _dcp_load({"model": state_dict}, os.path.join(path, MODEL_OPTIM_DIR), no_dist=True)
    if dtype is not None:
        state_dict = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state_dict.items()}
    tokenizer = AutoTokenizer.from_pretrained(hf_dir) if glob.glob(os.path.join(hf_dir, "tokenizer*")) else None
    save_hf_state_dict(config, state_dict, out_dir, model_class=model_class, tokenizer=tokenizer)
    for name in ("generation_config.json",) + PROCESSOR_FILES:
        if os.path.isfile(os.path.join(hf_dir, name)):
            with open(os.path.join(hf_dir, name)) as src, open(os.path.join(out_dir, name), "w") as dst:
                dst.write(src.read())
    return out_dir


def _state_dict_from_metadata(dcp_dir: str, skeleton: nn.Module) -> dict[str, torch.Tensor]:
    """Empty host tensors of the saved global shapes for the model keys the skeleton has (tied copies once)."""
    metadata = restricted_unpickle(os.path.join(dcp_dir, ".metadata"))
    wanted = set(skeleton.state_dict())
    out = {}
    for key, meta in metadata.state_dict_metadata.items():
        if not key.startswith("model."):
            continue
        name = key[len("model."):]
        if name in wanted and hasattr(meta, "size"):
            out[name] = torch.empty(meta.size, dtype=meta.properties.dtype)
    return out
