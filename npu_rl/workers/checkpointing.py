"""A worker's checkpoint: model + optimizer shards through :mod:`npu_rl.parallel.checkpoint` (DCP: reloads on any
number of ranks, merges into an HF folder), with the lr scheduler and this rank's RNG as the per-rank extra.

``checkpoint.save_contents`` / ``load_contents`` (verl's keys) choose among model, optimizer and extra; the model
is always saved (a checkpoint without it could not be resumed or merged).
"""

from __future__ import annotations

import contextlib
import os
import warnings

from npu_rl.device import get_backend
from npu_rl.models.lora import is_lora_model, save_adapter
from npu_rl.parallel.checkpoint import load_checkpoint, save_checkpoint

LORA_ADAPTER_DIR = "lora_adapter"


@contextlib.contextmanager
def _quiet_single_process():
    """DCP warns that it assumes a single process when there is no process group: that is intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_worker_state(path: str, model, optimizer, scheduler, contents=("model", "optimizer", "extra"),
                      tokenizer=None, base_path: str | None = None, hf_files=()) -> None:
    """With LoRA only the adapter and its optimizer state are saved (the base is the model folder, unchanged),
    plus the adapter as a PEFT folder in ``lora_adapter/`` (what ``npu-rl merge`` and ``npu-rl eval`` read; listed in
    the role's manifest, so both verify it before reading)."""
    lora = is_lora_model(model)
    extra = {"scheduler": scheduler.state_dict(), "rng": get_backend().rng_state()} if "extra" in contents else None
    if lora:  # first: the role's manifest (written when save_checkpoint completes) then lists lora_adapter/* too
        save_adapter(model, os.path.join(path, LORA_ADAPTER_DIR), base_path=base_path)
    with _quiet_single_process():
        save_checkpoint(path, model, optimizer if "optimizer" in contents else None, extra=extra, tokenizer=tokenizer,
                        trainable_only=lora, hf_files=hf_files)


def load_worker_state(path: str, model, optimizer, scheduler, contents=("model", "optimizer", "extra")) -> None:
    with _quiet_single_process():
        extra = load_checkpoint(path, model, optimizer, load_optimizer="optimizer" in contents,
                                trainable_only=is_lora_model(model))
    if "extra" in contents and extra is not None:
        scheduler.load_state_dict(extra["scheduler"])
        get_backend().set_rng_state(extra["rng"])
