"""Checkpoints that survive a kill at any moment.

Layout under ``trainer.default_local_dir``::

    global_step_40/
        actor/            model + optimizer + lr scheduler (torch.distributed.checkpoint: any number of ranks)
        critic/           the same, when there is a critic
        trainer_state.pt  step, epoch, dataloader position, RNG states, KL controller, NaN counter (safe_load format)
        manifest.json     SHA-256 of trainer_state.pt and of each role's own manifest.json (which hashes its files)
    latest_checkpointed_iteration.txt   "40", verl's marker name, written last

A step's folder is written as ``global_step_40.tmp`` and renamed when complete; the marker is replaced atomically
after the rename. A kill before the rename leaves the previous checkpoint as the latest; a ``.tmp`` left behind is
removed by the next save. ``max_actor_ckpt_to_keep`` prunes the oldest folders after a save.

Before a resume every file of the step is checked against the manifests (``verify_step``); a missing, truncated or
altered file is named. ``resume_mode=auto`` then falls back to the newest step that verifies, saying which file
failed; nothing in the folder is loaded in a way that could run code (``npu_rl.utils.safe_load``).

Symbolic links in the tree are never followed: a ``global_step_N(.tmp)`` that is a link is removed as a link (what
it points at is left alone) when a save needs the name, and a linked step folder or file is never read or hashed
(``verify_step`` refuses it; a resume falls back to the newest real step). A save that fails because the disk is
full says so (``DiskFullError``: where, how much is free), removes its partial folder and leaves ``latest`` on the
previous step.
"""

from __future__ import annotations

import errno
import os
import re
import resource
import shutil
import sys
from dataclasses import dataclass
from typing import Any

from npu_rl.parallel.manifest import MANIFEST, verify_manifest, write_manifest
from npu_rl.utils.safe_load import CorruptFileError, load_state, save_state

STATE_FILE = "trainer_state.pt"
MARKER = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")

RESUME_MODES = ("auto", "disable", "resume_path")  # trainer.resume_mode (CheckpointManager.resume_dir)


class DiskFullError(OSError):
    """A write failed because the file system is full (or over quota); the message names where."""


_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
LOW_SPACE_BYTES = 64 << 20  # below this much free space, a failed save is taken to be a full disk


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and everything behind it: causes, contexts, a Ray task error's ``cause`` (a save on a Ray worker),
    and the per-rank failures that DCP's ``CheckpointException`` (a ``BaseException``) carries as
    ``{rank: (exception, traceback)}``."""
    found, todo, seen = [], [exc], set()
    while todo:
        cause = todo.pop()
        if cause is None or id(cause) in seen:
            continue
        seen.add(id(cause))
        found.append(cause)
        todo += [cause.__cause__, cause.__context__]
        remote = getattr(cause, "cause", None)  # Ray's RayTaskError: what the worker raised
        if isinstance(remote, BaseException):
            todo.append(remote)
        failures = getattr(cause, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values() if isinstance(f, (tuple,
                                                                                                         BaseException))]
    return found


def _file_at_limit(path: str, limit: int) -> str | None:
    """A file under ``path`` that reached the file-size limit ``limit`` (its write was cut there)."""
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            try:
                if os.path.getsize(full) >= limit:
                    return full
            except OSError:
                continue
    return None


def disk_full_error(exc: BaseException, path: str) -> DiskFullError | None:
    """``exc`` (or what is behind it: DCP wraps the OSError in its own errors) as a ``DiskFullError`` naming the
    file, when a full disk or the file-size limit (``ulimit -f``) made the write fail; None when the failure is
    something else. ``path``: the folder being written, still in place (its files tell which one hit the limit)."""
    causes = _causes(exc)
    oserrors = [c for c in causes if isinstance(c, OSError)]
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    too_big = next((c for c in oserrors if c.errno == errno.EFBIG), None)
    at_limit = _file_at_limit(path, limit) if limit != resource.RLIM_INFINITY else None
    if too_big is not None or at_limit is not None:
        where = getattr(too_big, "filename", None) or at_limit or path
        shown = f"{limit} bytes" if limit != resource.RLIM_INFINITY else "a file-size limit"
        return DiskFullError(errno.EFBIG, f"file-size limit reached at {where} (ulimit -f allows {shown}): raise "
                                          "it (ulimit -f unlimited) or save smaller checkpoints, then resume")
    cause = next((c for c in oserrors if c.errno in _FULL), None)
    free = free_bytes(path)
    if cause is None and (free is None or free >= LOW_SPACE_BYTES):
        return None
    where = getattr(cause, "filename", None) or path
    have = f" ({free / 2**20:.0f} MiB free)" if free is not None else ""
    return DiskFullError(errno.ENOSPC, f"disk full at {where}{have}: free some space or point "
                                       "trainer.default_local_dir at a larger disk, then resume")


def free_bytes(path: str) -> int | None:
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def checkpoint_space_problem(root: str, model_path: str, lora: bool) -> str | None:
    """Known before any model loads: a full-weight checkpoint holds at least the model's weights (with the optimizer
    state, 3-6 times more); refuse when the disk under ``root`` has less free space than the weights' files."""
    folder = os.path.expanduser(str(model_path))
    if lora or not os.path.isdir(folder):
        return None  # a LoRA checkpoint holds only the adapter; a built-in model is converted later
    weights = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)
                  if n.endswith((".safetensors", ".bin")) and os.path.isfile(os.path.join(folder, n)))
    free = free_bytes(root)
    if free is None or not weights or free >= weights:
        return None
    return (f"trainer.default_local_dir={root}: {free / 2**30:.2f} GiB free, but one checkpoint of this model needs at "
            f"least {weights / 2**30:.2f} GiB (its weights; with the optimizer state 3-6x more): free space, choose a "
            "larger disk, or set trainer.save_freq=-1 and trainer.save_on_interrupt=False to save nothing")


def remove_path(path: str) -> None:
    """Remove a checkpoint folder or file; a symbolic link is removed as a link, never followed."""
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


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
    if not os.path.isfile(os.path.join(step_dir(root, step), STATE_FILE)):
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
                remove_path(os.path.join(self.root, name))
        tmp = step_dir(self.root, step) + ".tmp"
        os.makedirs(tmp)
        return tmp

    def abandon(self, tmp: str) -> None:
        """A save that failed: its partial folder goes (space back on a full disk); ``latest`` was not moved."""
        try:
            remove_path(tmp)
        except OSError as exc:
            print(f"npu-rl: warning: could not remove the partial checkpoint {tmp}: {exc}", file=sys.stderr)

    def commit(self, step: int, tmp: str, trainer_state: dict[str, Any]) -> str:
        """Write the trainer state and the step's manifest, rename the folder into place, then move the marker."""
        save_state(trainer_state, os.path.join(tmp, STATE_FILE))
        roles = sorted(name for name in os.listdir(tmp) if os.path.isfile(os.path.join(tmp, name, MANIFEST)))
        write_manifest(tmp, [STATE_FILE] + [os.path.join(role, MANIFEST) for role in roles])
        final = step_dir(self.root, step)
        if os.path.lexists(final):  # re-saving a step (a run restarted without resume): replace it whole
            remove_path(final)
        os.replace(tmp, final)
        _atomic_write_text(os.path.join(self.root, MARKER), str(step))
        self._prune()
        return final

    def _prune(self) -> None:
        if not self.max_to_keep or self.max_to_keep <= 0:
            return
        for step in saved_steps(self.root)[: -self.max_to_keep]:
            try:
                remove_path(step_dir(self.root, step))
            except OSError as exc:
                print(f"npu-rl: warning: could not prune {step_dir(self.root, step)}: {exc}", file=sys.stderr)

    def resume_dir(self, mode: str, resume_from_path: str | None) -> str | None:
        """The folder to resume from (``trainer.resume_mode``): auto -> the latest here, if any; disable -> None;
        resume_path -> ``resume_from_path`` (a ``global_step_N`` folder)."""
        if mode == "disable":
            return None
        if mode == "resume_path":
            path = os.path.expanduser(resume_from_path or "")
            if not os.path.isfile(os.path.join(path, STATE_FILE)):
                raise FileNotFoundError(f"trainer.resume_from_path={resume_from_path!r} is not a checkpoint folder "
                                        "(no trainer_state.pt); give a .../global_step_N folder")
            verify_step(path)
            return path
        return self.newest_verified()

    def newest_verified(self) -> str | None:
        """The marker's step if it verifies, else the newest step that does (saying which file failed); None when
        there is no checkpoint at all; an error listing every failure when none verifies."""
        try:
            marked = latest_step(self.root)
        except (ValueError, FileNotFoundError) as exc:
            print(f"npu-rl: warning: {exc}", file=sys.stderr)
            marked = None
        candidates = ([marked] if marked is not None else []) + \
            [s for s in reversed(saved_steps(self.root)) if s != marked]
        failures = []
        for step in candidates:
            path = step_dir(self.root, step)
            try:
                verify_step(path)
            except CorruptFileError as exc:
                failures.append(f"step {step}: {exc}")
                print(f"npu-rl: warning: checkpoint {path} does not verify: {exc}", file=sys.stderr)
                continue
            if failures:
                print(f"npu-rl: resuming from the newest checkpoint that verifies, {path}, instead", file=sys.stderr)
            return path
        if failures:
            raise CorruptFileError(f"no checkpoint under {self.root} verifies, so there is nothing safe to resume:\n  "
                                   + "\n  ".join(failures) + "\nMove the folder away (or set trainer.resume_mode="
                                   "disable with another trainer.default_local_dir) to start over.")
        return None


def verify_step(path: str) -> None:
    """Every file of a ``global_step_N`` folder against its manifests (hashes); ``CorruptFileError`` names a bad one."""
    if os.path.islink(os.path.normpath(path)):
        raise CorruptFileError(f"{path} is a symbolic link: checkpoints are never read through links")
    listed = verify_manifest(path)
    if STATE_FILE not in listed:
        raise CorruptFileError(f"{os.path.join(path, MANIFEST)} does not list {STATE_FILE}")
    for rel in listed:
        if os.path.basename(rel) == MANIFEST:
            verify_manifest(os.path.join(path, os.path.dirname(rel)))


def load_trainer_state(path: str) -> dict[str, Any]:
    return load_state(os.path.join(path, STATE_FILE))
