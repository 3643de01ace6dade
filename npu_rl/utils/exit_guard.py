"""User code run inside our process (an in-process reward function) must not end the process without a word.

``sys.exit`` raises ``SystemExit`` and a caller can catch it. ``os._exit`` cannot be caught: it ends the process
at once, skipping ``finally`` blocks, atexit and every log handler, so a trainer whose reward function calls it just
disappears. And a ``KeyboardInterrupt`` the code raises itself reads like the user's Ctrl-C. While
:func:`guard_exits` is active on a thread:

- ``os._exit`` (and ``posix._exit``, the same function) called **from that thread, in this process** raises
  :class:`ExitAttempt` (a ``BaseException``, so a user's ``except Exception`` does not swallow it) naming the call.
  Any other thread, and a child made with ``fork`` (multiprocessing's children end with ``os._exit``), gets the real
  ``os._exit``. The replacement is installed when the first guard starts and the original put back when the last
  one ends (a counter under a lock), so the process runs with the real function whenever no user code does.
- A real SIGINT / SIGTERM that arrives meanwhile is recorded (``received``) before the handler that was installed
  runs, so the caller can tell the user's Ctrl-C (re-raise it) from a ``KeyboardInterrupt`` the code raised itself
  (a failure of that code). Main thread only (signals are delivered there); only Python handlers are wrapped.

What no guard in the process can catch: a reference to ``os._exit`` taken before the guard started
(``from os import _exit`` at import), ``os.kill(os.getpid(), SIGKILL)``, ``exit()`` called from C, a crash in C
code, and ``os._exit`` from a thread the code started. Only a separate process observes those: the reward pool
(``reward_model.num_workers >= 1``) reports "the reward worker died while scoring (exit code N)" naming the row.
"""

from __future__ import annotations

import contextlib
import os
import posix
import signal
import threading
from typing import Iterator

_real_exit = os._exit
_lock = threading.Lock()
_active = 0
_owner_pid = 0
_local = threading.local()


class ExitAttempt(BaseException):
    """``os._exit(code)`` called by guarded code; ``str()`` is the call, e.g. ``os._exit(3)``."""

    def __init__(self, code: object):
        super().__init__(f"os._exit({code!r})")
        self.code = code


def _guarded_exit(code: int) -> None:
    if getattr(_local, "depth", 0) and os.getpid() == _owner_pid:
        raise ExitAttempt(code)
    _real_exit(code)


class _Signals:
    received = False


@contextlib.contextmanager
def guard_exits() -> Iterator[_Signals]:
    """Guard the calling thread while the body runs (see the module docstring); yields whether a real SIGINT or
    SIGTERM arrived meanwhile (``.received``)."""
    global _active, _owner_pid
    with _lock:
        if _active == 0:
            _owner_pid = os.getpid()
            os._exit = posix._exit = _guarded_exit
        _active += 1
    _local.depth = getattr(_local, "depth", 0) + 1
    seen = _Signals()
    wrapped: dict[int, tuple[object, object]] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(signum)
            if callable(previous):
                def on_signal(number, frame, previous=previous):
                    seen.received = True
                    previous(number, frame)

                wrapped[signum] = (previous, on_signal)
                signal.signal(signum, on_signal)
    try:
        yield seen
    finally:
        for signum, (previous, ours) in wrapped.items():
            # only if still ours: a handler that ran meanwhile may have put another in place (the trainer's
            # second Ctrl-C gives the default one back before raising KeyboardInterrupt)
            if signal.getsignal(signum) is ours:
                signal.signal(signum, previous)
        _local.depth -= 1
        with _lock:
            _active -= 1
            if _active == 0:
                os._exit = posix._exit = _real_exit
