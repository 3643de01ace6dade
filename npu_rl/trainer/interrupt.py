"""Ctrl-C and SIGTERM during training: finish the current step, save it, say how to resume, exit 130 / 143.

The first SIGINT or SIGTERM only sets a flag (``InterruptGuard.requested``): the step in progress finishes (its
generation, reward, update and any save it was due), then the loop stops, writes a checkpoint of that step when
``trainer.save_on_interrupt`` (default on) and it was not just saved, prints where it is and the exact command that
resumes, and returns the conventional exit code (128 + signal: 130 for SIGINT, 143 for SIGTERM). A second signal
raises ``KeyboardInterrupt`` at once (the step is abandoned; the last checkpoint stays whole, see
``trainer/checkpoint.py``); ``npu_rl.cli`` turns it into exit code 130 without a traceback. ``finally`` blocks
still shut the worker group and the reward pool down (its workers ignore SIGINT and exit when their pipe closes).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from typing import Optional

from npu_rl.utils.redact import redact_argv

_COMMAND: Optional[list[str]] = None  # the command line that started this run, for the resume hint


def set_command(argv: list[str]) -> None:
    """Record the command that started the run (``main_ppo.main`` does): the resume hint repeats it."""
    global _COMMAND
    _COMMAND = list(argv)


def resume_command(extra: list[str]) -> str:
    """The command that started this run, without its resume keys, plus ``extra``."""
    argv = _COMMAND if _COMMAND is not None else ["npu-rl", "train", *sys.argv[1:]]
    kept = [a for a in argv if not a.lstrip("+").startswith(("trainer.resume_mode=", "trainer.resume_from_path="))]

    return shlex.join(redact_argv(kept + extra))  # printed: secrets masked (give them again, e.g. from the env)


class InterruptGuard:
    """``with InterruptGuard() as guard:`` SIGINT / SIGTERM set ``guard.signum``; a second one raises
    ``KeyboardInterrupt``. Outside the main thread it does nothing (signals go to the main thread)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum or signal.SIGINT)

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            self.restore()
            print(f"\nnpu-rl: {signal.Signals(signum).name} again: stopping now, the step in progress is lost "
                  "(the last checkpoint is whole)", file=sys.stderr, flush=True)
            raise KeyboardInterrupt
        self.signum = signum
        print(f"\nnpu-rl: {signal.Signals(signum).name} received: finishing this step, then saving a checkpoint "
              "(press Ctrl-C again to stop at once)", file=sys.stderr, flush=True)

    def __enter__(self) -> "InterruptGuard":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def __exit__(self, *exc) -> None:
        self.restore()


def stop_after_interrupt(trainer, guard: InterruptGuard, saved: bool) -> int:
    """Save the finished step (unless it was just saved, or saving on interrupt is off), print where it is and how to
    resume; the exit code."""
    cfg = trainer.config.trainer
    root = os.path.abspath(cfg.default_local_dir)
    name = signal.Signals(guard.signum).name
    step = trainer.global_step
    if step == 0:
        print(f"npu-rl: {name}: stopped before the first step finished; nothing to save", file=sys.stderr)
        return guard.exit_code
    if not saved and getattr(cfg, "save_on_interrupt", True):
        path = trainer.save_checkpoint()
        saved = True
        print(f"npu-rl: {name}: saved step {step} to {path}", file=sys.stderr)
    elif saved:
        print(f"npu-rl: {name}: step {step} is saved in {os.path.join(root, f'global_step_{step}')}", file=sys.stderr)
    if saved:
        print(f"npu-rl: resume with: {resume_command(['trainer.resume_mode=auto'])}", file=sys.stderr, flush=True)
    else:
        print(f"npu-rl: {name}: stopped after step {step} without saving (trainer.save_on_interrupt=False)",
              file=sys.stderr)
    return guard.exit_code
