"""Save / load a worker's model, optimizer, lr scheduler and RNG with torch.distributed.checkpoint.

DCP writes each rank's shards plus metadata and can reload them on a different number of ranks, so a run saved on
8 devices resumes on 4; in one process without a process group it works the same. The lr scheduler and RNG states
are small and per-rank: ``extra_rank{r}.pt``.
"""

from __future__ import annotations

import contextlib
import os
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from npu_rl.device import get_backend
from npu_rl.workers import distributed


@contextlib.contextmanager
def _quiet_single_process():
    """DCP warns that it assumes a single process when there is no process group: that is intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_worker_state(path: str, model, optimizer, scheduler, contents=("model", "optimizer", "extra")) -> None:
    os.makedirs(path, exist_ok=True)
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {}
    if "model" in contents:
        state["model"] = model_state
    if "optimizer" in contents:
        state["optimizer"] = optim_state
    with _quiet_single_process():
        dcp.save(state, checkpoint_id=path)
    if "extra" in contents:
        extra = {"scheduler": scheduler.state_dict(), "rng": get_backend().rng_state()}
        torch.save(extra, os.path.join(path, f"extra_rank{distributed.rank()}.pt"))


def load_worker_state(path: str, model, optimizer, scheduler, contents=("model", "optimizer", "extra")) -> None:
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint folder {path} does not exist")
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {}
    if "model" in contents:
        state["model"] = model_state
    if "optimizer" in contents:
        state["optimizer"] = optim_state
    with _quiet_single_process():
        dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state.get("model", model_state),
                   optim_state_dict=state.get("optimizer", optim_state),
                   options=StateDictOptions(strict="model" in contents))
    extra_path = os.path.join(path, f"extra_rank{distributed.rank()}.pt")
    if "extra" in contents and not os.path.isfile(extra_path):
        extra_path = os.path.join(path, "extra_rank0.pt")  # resumed on more ranks than saved: rank 0's schedule
    if "extra" in contents and os.path.isfile(extra_path):
        extra = torch.load(extra_path, weights_only=False)
        scheduler.load_state_dict(extra["scheduler"])
        get_backend().set_rng_state(extra["rng"])
