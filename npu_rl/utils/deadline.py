"""One deadline for a whole piece of work (a reward batch, a rollout's tool calls), and a way to cut Python code at it.

A ``Deadline`` is a point in ``time.monotonic()``; each call inside the work gets ``deadline.cap(per_call_s)``
seconds: its own limit, or less when the whole piece must end sooner. So N hung calls cost one deadline, never
N per-call limits one after the other::

    deadline = Deadline(300.0)                      # the batch
    for row in rows:
        if deadline.expired:
            ...count the rest as not scored, stop...
        with alarm(deadline.cap(10.0)):             # this row: 10 s, or what is left of the batch
            score(row)

``alarm`` raises ``AlarmTimeout`` (a ``BaseException``: a user's ``except Exception`` does not swallow it) in the
main thread with ``SIGALRM``. It cannot stop C code that never returns to the interpreter, and it works only on the
main thread: for a hard bound run the work in a process and kill it (``npu_rl.reward.pool.ProcessPoolRunner``).
An outer alarm already armed is restored afterwards, and fires at once if its time passed meanwhile.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from typing import Iterator, Optional


class AlarmTimeout(BaseException):
    """Raised inside the code an ``alarm`` cuts."""


class Deadline:
    """``seconds`` from now (``None`` or ``inf``: never)."""

    def __init__(self, seconds: Optional[float] = None, *, clock=time.monotonic):
        self._clock = clock
        self.seconds = math.inf if seconds is None else max(0.0, float(seconds))
        self.at = clock() + self.seconds

    def remaining(self) -> float:
        return max(0.0, self.at - self._clock())

    @property
    def expired(self) -> bool:
        return self._clock() >= self.at

    def cap(self, per_call_s: Optional[float]) -> float:
        """Seconds one call may take: its own limit (``None``/<=0: none) or what is left of this deadline."""
        own = math.inf if per_call_s is None or per_call_s <= 0 else float(per_call_s)
        return min(own, self.remaining())


def can_alarm() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def alarm(seconds: float) -> Iterator[None]:
    """Raise ``AlarmTimeout`` in the body after ``seconds`` (``inf``: no limit). Main thread only."""
    if math.isinf(seconds):
        yield
        return
    if not can_alarm():
        raise RuntimeError("alarm() works only on the main thread of a POSIX process")
    if seconds <= 0:
        raise AlarmTimeout()

    def on_alarm(signum, frame):
        raise AlarmTimeout()

    outer_left, _ = signal.getitimer(signal.ITIMER_REAL)
    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)
        if outer_left > 0:  # give the outer alarm back what it had left (at least a tick, so it still fires)
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, outer_left - (time.monotonic() - started)))
