"""Running a reward function over many rows: in this process, or in a pool of worker processes with a timeout.

Both runners take a list of payloads (keyword arguments of one call) and return one ``Outcome`` per payload:
``ok`` with the checked result, ``error`` with the exception's text, or ``timeout``. The manager decides what an
error or a timeout means (stop the run, or score 0 and count it).

``ProcessPoolRunner`` starts ``num_workers`` processes with ``python -m npu_rl.reward._pool_worker`` (not fork,
not multiprocessing's spawn: nothing of the trainer's state, threads or ``__main__`` module is inherited or
re-imported), sends each the ``ScoreFnSpec`` (a few strings), and each worker loads the function itself. A call
that runs past ``timeout_s`` has its worker killed and replaced: a hung sympy simplification or a user function
stuck in a loop costs one row, not the run. A worker whose parent dies sees its pipe close and exits.

``InProcessRunner`` (``num_workers: 0``) cuts a call with ``SIGALRM`` when it runs on the main thread; C code that
never returns to the interpreter (a catastrophic regex) cannot be interrupted that way: use workers for a hard bound.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Optional

from npu_rl.reward.math_utils import outer_alarm_active
from npu_rl.reward.score_fn import ScoreFnSpec, run_score_fn

logger = logging.getLogger(__name__)

WORKER_START_TIMEOUT_S = 120.0


@dataclass
class Outcome:
    status: str  # ok | error | timeout
    value: Any = None
    error: str = ""
    traceback: str = ""


def execute(fn: Callable[..., Any], spec: ScoreFnSpec, payload: dict[str, Any]) -> Outcome:
    try:
        return Outcome("ok", run_score_fn(fn, spec, payload))
    except Exception as exc:  # the user's function may raise anything; the manager reports it with the row
        return Outcome("error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())


class _ScoreTimeout(BaseException):
    """Raised by the alarm handler; a BaseException so that a user's ``except Exception`` does not swallow it."""


class InProcessRunner:
    def __init__(self, spec: ScoreFnSpec, timeout_s: float):
        self.spec = spec
        self.timeout_s = timeout_s
        self._fn: Optional[Callable[..., Any]] = None
        self._warned = False

    def run(self, payloads: list[dict[str, Any]]) -> list[Outcome]:
        if self._fn is None:
            self._fn = self.spec.load()
        use_alarm = self.timeout_s > 0 and hasattr(signal, "setitimer") \
            and threading.current_thread() is threading.main_thread()
        if self.timeout_s > 0 and not use_alarm and not self._warned:
            self._warned = True
            logger.warning("reward_model.timeout_s cannot be enforced in-process off the main thread; "
                           "set reward_model.num_workers > 0 for a hard time limit")
        if not use_alarm:
            return [execute(self._fn, self.spec, p) for p in payloads]
        return [self._with_alarm(p) for p in payloads]

    def _with_alarm(self, payload: dict[str, Any]) -> Outcome:
        def on_alarm(signum, frame):
            raise _ScoreTimeout()

        previous = signal.signal(signal.SIGALRM, on_alarm)
        try:
            signal.setitimer(signal.ITIMER_REAL, self.timeout_s)
            try:
                with outer_alarm_active():
                    return execute(self._fn, self.spec, payload)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _ScoreTimeout:
            return Outcome("timeout")
        finally:
            signal.signal(signal.SIGALRM, previous)

    def close(self) -> None:
        pass


class _Worker:
    """One scoring process and the two pipes to it."""

    def __init__(self, spec: ScoreFnSpec):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ)
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in sys.path if p and os.path.isdir(p)])
        env.setdefault("OMP_NUM_THREADS", "1")
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "npu_rl.reward._pool_worker", str(to_child_r), str(from_child_w)],
                pass_fds=(to_child_r, from_child_w), env=env, stdin=subprocess.DEVNULL, close_fds=True,
            )
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.send_conn = Connection(to_child_w, readable=False)
        self.recv_conn = Connection(from_child_r, writable=False)
        self.send_conn.send(("init", spec))
        self.task: Optional[tuple[int, float]] = None  # (payload index, start time)

    def wait_ready(self, spec: ScoreFnSpec) -> None:
        if not self.recv_conn.poll(WORKER_START_TIMEOUT_S):
            self.kill()
            raise RuntimeError(f"a reward worker did not start within {WORKER_START_TIMEOUT_S:.0f} s")
        try:
            kind, message = self.recv_conn.recv()
        except EOFError:
            code = self.process.wait()
            raise RuntimeError(f"a reward worker exited at start (exit code {code}); see its stderr above") from None
        if kind != "ready":
            self.kill()
            from npu_rl.reward.score_fn import RewardFunctionError

            raise RewardFunctionError(f"loading {spec.describe()} in a reward worker failed: {message}")

    def kill(self) -> None:
        for conn in (self.send_conn, self.recv_conn):
            try:
                conn.close()
            except OSError:
                pass
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        try:
            self.send_conn.send(("exit",))
        except OSError:
            pass
        try:
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


def _stop_all(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.stop()
    workers.clear()


class ProcessPoolRunner:
    def __init__(self, spec: ScoreFnSpec, num_workers: int, timeout_s: float):
        if num_workers < 1:
            raise ValueError(f"reward_model.num_workers must be >= 1 for a pool, got {num_workers}")
        self.spec = spec
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)

    def _start(self, count: int = 1) -> list[_Worker]:
        """``count`` workers, started together (each takes ~0.2 s to import and load the function)."""
        workers = [_Worker(self.spec) for _ in range(count)]
        try:
            for worker in workers:
                worker.wait_ready(self.spec)
        except BaseException:
            for worker in workers:
                worker.kill()
            raise
        return workers

    def run(self, payloads: list[dict[str, Any]]) -> list[Outcome]:
        outcomes: list[Optional[Outcome]] = [None] * len(payloads)
        pending = deque(range(len(payloads)))
        missing = min(self.num_workers, max(len(payloads), 1)) - len(self._workers)
        if missing > 0:
            self._workers.extend(self._start(missing))
        while pending or any(w.task for w in self._workers):
            for slot, worker in enumerate(self._workers):
                if worker.task is None and pending:
                    if worker.process.poll() is not None:  # died between batches
                        worker.kill()
                        worker = self._workers[slot] = self._start()[0]
                    index = pending.popleft()
                    try:
                        worker.send_conn.send(("task", index, payloads[index]))
                    except OSError:  # it died just now (BrokenPipeError): replace it, retry the row
                        pending.appendleft(index)
                        worker.kill()
                        self._workers[slot] = self._start()[0]
                        continue
                    worker.task = (index, time.monotonic())
            self._collect(outcomes)
        return [o if o is not None else Outcome("error", error="internal: no outcome") for o in outcomes]

    def _collect(self, outcomes: list[Optional[Outcome]]) -> None:
        busy = [w for w in self._workers if w.task is not None]
        now = time.monotonic()
        deadline = min(start + self.timeout_s for _, start in (w.task for w in busy)) if self.timeout_s > 0 else None
        ready = wait([w.recv_conn for w in busy], timeout=None if deadline is None else max(0.0, deadline - now))
        for worker in busy:
            index, start = worker.task
            if worker.recv_conn in ready:
                try:
                    _, task_index, outcome = worker.recv_conn.recv()
                    assert task_index == index, (task_index, index)
                    outcomes[index], worker.task = outcome, None
                    continue
                except EOFError:
                    code = worker.process.wait()
                    outcomes[index] = Outcome("error", error=f"the reward worker died while scoring (exit code {code})")
            elif self.timeout_s > 0 and time.monotonic() - start >= self.timeout_s:
                outcomes[index] = Outcome("timeout")
            else:
                continue
            worker.kill()  # hung or dead: replace it
            self._workers[self._workers.index(worker)] = self._start()[0]

    def close(self) -> None:
        self._finalizer()
