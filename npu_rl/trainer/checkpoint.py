"""Checkpoints that survive a kill at any moment.

Layout under ``trainer.default_local_dir``::

    global_step_40/
        actor/            model + optimizer + lr scheduler (torch.distributed.checkpoint: any number of ranks)
        critic/           the same, when there is a critic
        trainer_state.pt  step, epoch, dataloader position, RNG states, KL controller, NaN counter
    latest_checkpointed_iteration.txt   "40", verl's marker name, written last

A step's folder is written as ``global_step_40.tmp`` and renamed when complete; the marker is replaced atomically
after the rename. A kill before the rename leaves the previous checkpoint as the latest; a ``.tmp`` left behind is
removed by the next save. ``max_actor_ckpt_to_keep`` prunes the oldest folders after a save.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from typing import Any

import torch

MARKER = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"global_step_{step}")


def _atomic_write_text(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def latest_step(root: str) -> int | None:
    """The step the marker names, or None when there is no complete checkpoint."""
    marker = os.path.join(root, MARKER)
    if not os.path.isfile(marker):
        return None
    text = open(marker, encoding="utf-8").read().strip()
    if not text.isdigit():
        raise ValueError(f"{marker} should hold a step number, found {text!r}")
    step = int(text)
    if not os.path.isfile(os.path.join(step_dir(root, step), "trainer_state.pt")):
        raise FileNotFoundError(f"{marker} names step {step} but {step_dir(root, step)} is missing or incomplete")
    return step


def saved_steps(root: str) -> list[int]:
    if not os.path.isdir(root):
        return []
    return sorted(int(m.group(1)) for name in os.listdir(root) if (m := _STEP_DIR.match(name)))


@dataclass
class CheckpointManager:
    root: str
    max_to_keep: int | None = None

    def begin(self, step: int) -> str:
        """A fresh temporary folder for ``step``'s checkpoint (workers write into it)."""
        os.makedirs(self.root, exist_ok=True)
        for name in os.listdir(self.root):
            if name.endswith(".tmp") and name.startswith("global_step_"):
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)
        tmp = step_dir(self.root, step) + ".tmp"
        os.makedirs(tmp)
        return tmp

    def commit(self, step: int, tmp: str, trainer_state: dict[str, Any]) -> str:
        """Write the trainer state, rename the folder into place, then move the marker."""
        torch.save(trainer_state, os.path.join(tmp, "trainer_state.pt"))
        final = step_dir(self.root, step)
        if os.path.exists(final):  # re-saving a step (a run restarted without resume): replace it whole
            shutil.rmtree(final)
        os.replace(tmp, final)
        _atomic_write_text(os.path.join(self.root, MARKER), str(step))
        self._prune()
        return final

    def _prune(self) -> None:
        if not self.max_to_keep or self.max_to_keep <= 0:
            return
        for step in saved_steps(self.root)[: -self.max_to_keep]:
            shutil.rmtree(step_dir(self.root, step), ignore_errors=True)

    def resume_dir(self, mode: str, resume_from_path: str | None) -> str | None:
        """The folder to resume from (``trainer.resume_mode``): auto -> the latest here, if any; disable -> None;
        resume_path -> ``resume_from_path`` (a ``global_step_N`` folder)."""
        if mode == "disable":
            return None
        if mode == "resume_path":
            path = os.path.expanduser(resume_from_path or "")
            if not os.path.isfile(os.path.join(path, "trainer_state.pt")):
                raise FileNotFoundError(f"trainer.resume_from_path={resume_from_path!r} is not a checkpoint folder "
                                        "(no trainer_state.pt); give a .../global_step_N folder")
            return path
        step = latest_step(self.root)
        return step_dir(self.root, step) if step is not None else None


def load_trainer_state(path: str) -> dict[str, Any]:
    return torch.load(os.path.join(path, "trainer_state.pt"), weights_only=False)
