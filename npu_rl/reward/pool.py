"""Running a reward function over many rows: in this process, or in a pool of worker processes with a timeout.

Both runners take a list of payloads (keyword arguments of one call) and a ``Deadline`` for the whole list, and
return one ``Outcome`` per payload: ``ok`` with the checked result, ``error`` with the exception's text, ``timeout``
(the call ran past ``timeout_s`` or past the batch's deadline), or ``skipped`` (never finished: the deadline passed
first, or ``stop_on_problem`` stopped the batch at another row's failure). So a hung function costs one deadline per
batch, not ``timeout_s`` per row. The manager decides what an error or a timeout means (stop the run, or score 0 and
count it).

``ProcessPoolRunner`` starts ``num_workers`` processes with ``python -m npu_rl.reward._pool_worker`` (not fork,
not multiprocessing's spawn: nothing of the trainer's state, threads or ``__main__`` module is inherited or
re-imported), sends each the ``ScoreFnSpec`` (a few strings), and each worker loads the function itself. A call
that runs past its limit has its worker killed at once (replaced when the batch goes on): a hung sympy
simplification or a user function stuck in a loop costs one row, not the run. A worker whose parent dies sees its
pipe close and exits.

``InProcessRunner`` (``num_workers: 0``) cuts a call with ``SIGALRM`` (``npu_rl.utils.deadline.alarm``) when it runs
on the main thread; C code that never returns to the interpreter (a catastrophic regex) cannot be interrupted that
way: use workers for a hard bound.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import time
import traceback
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Optional

from npu_rl.reward.math_utils import outer_alarm_active
from npu_rl.reward.score_fn import RewardFunctionError, ScoreFnSpec, run_score_fn
from npu_rl.utils.deadline import AlarmTimeout, Deadline, alarm, can_alarm
from npu_rl.utils.exit_guard import ExitAttempt, guard_exits

logger = logging.getLogger(__name__)

WORKER_START_TIMEOUT_S = 120.0


@dataclass
class Outcome:
    status: str  # ok | error | timeout | skipped (never run: the batch stopped or its deadline passed first)
    value: Any = None
    error: str = ""
    traceback: str = ""


def execute(fn: Callable[..., Any], spec: ScoreFnSpec, payload: dict[str, Any]) -> Outcome:
    """One call, never the end of the process: ``sys.exit``, ``os._exit`` and a ``KeyboardInterrupt`` the function
    raises itself are errors of that row (the manager names the function and the row); the user's own Ctrl-C still
    interrupts (``utils/exit_guard.py``)."""
    with guard_exits() as signals:
        try:
            return Outcome("ok", run_score_fn(fn, spec, payload))
        except Exception as exc:  # the user's function may raise anything; the manager reports it with the row
            return Outcome("error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        except SystemExit as exc:  # sys.exit() in a reward function is a failure of that row, not the end of the run
            return Outcome("error", error=f"the reward function called sys.exit({exc.code!r})",
                           traceback=traceback.format_exc())
        except ExitAttempt as exc:  # os._exit() would have ended the trainer without a word
            return Outcome("error", error=f"the reward function called {exc}, which would have ended the trainer",
                           traceback=traceback.format_exc())
        except KeyboardInterrupt:
            if signals.received:
                raise  # the user's Ctrl-C (or a second one): the trainer's interrupt handling decides
            return Outcome("error", error="the reward function raised KeyboardInterrupt itself (no Ctrl-C arrived)",
                           traceback=traceback.format_exc())


def _timed_out(per_call_s: float, cut_by_deadline: bool, deadline: Deadline) -> Outcome:
    if cut_by_deadline:
        return Outcome("timeout", error=f"the batch's deadline ({deadline.seconds:g} s) passed while it ran")
    return Outcome("timeout", error=f"ran past the per-call limit of {per_call_s:g} s")


def _skipped(reason: str) -> Outcome:
    return Outcome("skipped", error=reason)


class InProcessRunner:
    def __init__(self, spec: ScoreFnSpec, timeout_s: float):
        self.spec = spec
        self.timeout_s = timeout_s
        self._fn: Optional[Callable[..., Any]] = None
        self._warned = False

    def run(self, payloads: list[dict[str, Any]], deadline: Optional[Deadline] = None,
            stop_on_problem: bool = False) -> list[Outcome]:
        """One outcome per payload. Each call gets ``timeout_s`` or what is left of ``deadline``, whichever is
        less; once the deadline passed the rest are ``skipped``. ``stop_on_problem``: after the first error or
        timeout, the rest are ``skipped`` (the caller is about to stop anyway)."""
        if self._fn is None:
            self._fn = self.spec.load()
        deadline = deadline or Deadline(None)
        use_alarm = can_alarm()
        if not use_alarm and not self._warned:
            self._warned = True
            logger.warning("reward_model.timeout_s cannot be enforced in-process off the main thread; "
                           "set reward_model.num_workers > 0 for a hard time limit")
        outcomes: list[Outcome] = []
        for payload in payloads:
            if stop_on_problem and outcomes and outcomes[-1].status in ("error", "timeout", "skipped"):
                outcomes.append(_skipped("not scored: the batch stopped at an earlier row's failure"))
            elif deadline.expired:
                outcomes.append(_skipped(f"not scored: the batch's deadline ({deadline.seconds:g} s) passed"))
            elif not use_alarm:
                outcomes.append(execute(self._fn, self.spec, payload))
            else:
                limit = deadline.cap(self.timeout_s)
                try:
                    with alarm(limit), outer_alarm_active():
                        outcomes.append(execute(self._fn, self.spec, payload))
                except AlarmTimeout:
                    outcomes.append(_timed_out(self.timeout_s, limit < self.timeout_s, deadline))
        return outcomes

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

    def run(self, payloads: list[dict[str, Any]], deadline: Optional[Deadline] = None,
            stop_on_problem: bool = False) -> list[Outcome]:
        """One outcome per payload, like ``InProcessRunner.run``; a call past its limit or past ``deadline`` has its
        worker killed at once. ``stop_on_problem``: at the first error or timeout, every busy worker is killed and
        whatever did not finish is ``skipped``."""
        deadline = deadline or Deadline(None)
        outcomes: list[Optional[Outcome]] = [None] * len(payloads)
        pending = deque(range(len(payloads)))
        missing = min(self.num_workers, max(len(payloads), 1)) - len(self._workers)
        if missing > 0:
            self._workers.extend(self._start(missing))
        while pending or any(w.task for w in self._workers):
            stop = stop_on_problem and any(o is not None and o.status in ("error", "timeout") for o in outcomes)
            if stop or deadline.expired:
                reason = ("not scored: the batch stopped at an earlier row's failure" if stop else
                          f"not scored: the batch's deadline ({deadline.seconds:g} s) passed before it started")
                self._abandon(outcomes, deadline, stopped=stop)
                for index in pending:
                    outcomes[index] = _skipped(reason)
                pending.clear()
                break
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
            self._collect(outcomes, deadline, restart=not stop_on_problem)
        return [o if o is not None else Outcome("error", error="internal: no outcome") for o in outcomes]

    def _abandon(self, outcomes: list[Optional[Outcome]], deadline: Deadline, stopped: bool) -> None:
        """Kill every busy worker now (replaced at the next batch); their rows are counted, not waited for."""
        for worker in [w for w in self._workers if w.task is not None]:
            index, _ = worker.task
            outcomes[index] = _skipped("killed in flight: the batch stopped at another row's failure") if stopped \
                else _timed_out(self.timeout_s, True, deadline)
            worker.kill()
            self._workers.remove(worker)

    def _collect(self, outcomes: list[Optional[Outcome]], deadline: Deadline, restart: bool = True) -> None:
        busy = [w for w in self._workers if w.task is not None]
        if not busy:
            return
        own = self.timeout_s if self.timeout_s > 0 else math.inf
        ends = [min(start + own, deadline.at) for _, start in (w.task for w in busy)]
        wait_s = min(ends) - time.monotonic()
        ready = wait([w.recv_conn for w in busy], timeout=None if math.isinf(wait_s) else max(0.0, wait_s))
        for worker, end in zip(busy, ends):
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
            elif time.monotonic() >= end:
                outcomes[index] = _timed_out(self.timeout_s, end < start + own, deadline)
            else:
                continue
            worker.kill()  # hung or dead: replace it (or leave the slot empty when the batch is about to stop)
            if restart and not deadline.expired:
                self._workers[self._workers.index(worker)] = self._start()[0]
            else:
                self._workers.remove(worker)

    def close(self) -> None:
        self._finalizer()
