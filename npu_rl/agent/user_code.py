"""Calling a user's tool or interaction with a deadline that always fires, from an agent loop's event loop.

The agent loops share one asyncio event loop. Code a user wrote for a tool or an interaction may block: a plain
``def execute`` sleeping, or an ``async def`` that calls ``time.sleep`` and so stops the whole event loop (no
``asyncio.wait_for`` can fire then). So no user code runs on the agents' loop:

- an ``async`` method runs on the *tool loop*, a second event loop in a daemon thread shared by all tools and
  interactions (state such as an HTTP session made there keeps working from call to call);
- a plain function runs in a daemon thread of its own.

The agents' loop waits for the result with ``asyncio.wait_for(..., timeout)``; at the deadline it stops waiting and
the call counts as timed out. A thread cannot be killed: a stuck one finishes (or not) on its own, but it is a
daemon thread nobody joins, so ``asyncio.run`` and the interpreter exit never wait for it (``asyncio.to_thread``'s
executor is joined at both). A tool loop that missed a deadline is given up (stopped once it is free again) and the
next call starts a fresh one, so one stuck call cannot make every later call time out (the old loop finishes
the calls still on it, then ends).

User code must not end the process either (``npu_rl/utils/exit_guard.py``, as for an in-process reward): every call
runs under ``guard_exits`` in the thread that runs it, and so does the agents' loop itself (a user's agent loop).
``os._exit`` there raises :class:`UserCodeExit`, which no ``except Exception`` of ours swallows: the rollout stops
with an error naming the row, the loop and the function (the run ends non-zero, never with a silent status 0).
``SystemExit`` and ``KeyboardInterrupt`` raised by a tool or an interaction fail that call only
(:class:`UserCodeError`): they never reach an event loop, where asyncio would re-raise them and stop the loop (the
tool loop's thread: every later call would time out; the agents' loop: the rollout would read them as Ctrl-C).
A ``KeyboardInterrupt`` in those threads is always the code's own: signals are delivered to the main thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import math
import threading
from typing import Any, Callable, Optional

from npu_rl.utils.exit_guard import ExitAttempt, guard_exits

logger = logging.getLogger(__name__)


class UserCodeTimeout(Exception):
    """A tool's or an interaction's call did not answer within its deadline."""


class UserCodeError(Exception):
    """A tool or an interaction raised ``SystemExit`` / ``KeyboardInterrupt``: that call failed, nothing more."""


class UserCodeExit(BaseException):
    """User code called ``os._exit``: the rollout stops with this error (a ``BaseException``, so no ``except
    Exception`` on the way turns it into a failed call), the message naming the function."""


def _name(fn: Callable[..., Any]) -> str:
    owner = getattr(fn, "__self__", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"{type(owner).__name__}.{getattr(fn, '__name__', name)}" if owner is not None else name


def _exit_to_error(fn: Callable[..., Any], exc: BaseException) -> BaseException:
    if isinstance(exc, ExitAttempt):
        return UserCodeExit(f"{_name(fn)} called {exc}, which would have ended the trainer")
    if isinstance(exc, SystemExit):
        return UserCodeError(f"{_name(fn)} raised SystemExit({exc.code!r})")
    return UserCodeError(f"{_name(fn)} raised KeyboardInterrupt itself")


def _guarded_call(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    with guard_exits():
        try:
            return fn(*args, **kwargs)
        except (ExitAttempt, SystemExit, KeyboardInterrupt) as exc:
            raise _exit_to_error(fn, exc) from None


async def _guarded_coroutine(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    with guard_exits():  # the tool loop's thread runs only user code: guarded across the awaits too
        try:
            return await fn(*args, **kwargs)
        except (ExitAttempt, SystemExit, KeyboardInterrupt) as exc:
            raise _exit_to_error(fn, exc) from None


class _ToolLoop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._serve, name="npu-rl-tool-loop", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def give_up(self) -> None:
        """No new calls come here; the loop ends once the calls still on it have (a stuck one: when it returns)."""

        async def drain() -> None:
            me = asyncio.current_task()
            while any(t is not me and not t.done() for t in asyncio.all_tasks()):
                await asyncio.sleep(0.05)
            self.loop.stop()

        try:
            asyncio.run_coroutine_threadsafe(drain(), self.loop)
        except RuntimeError:  # already closed
            pass


_lock = threading.Lock()
_current: Optional[_ToolLoop] = None


def _tool_loop() -> _ToolLoop:
    global _current
    with _lock:
        if _current is None:
            _current = _ToolLoop()
        return _current


def _give_up(tool_loop: _ToolLoop) -> None:
    global _current
    with _lock:
        if _current is tool_loop:
            _current = None
    tool_loop.give_up()


def _in_daemon_thread(fn: Callable[..., Any], args: tuple, kwargs: dict) -> asyncio.Future:
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(setter, value):
        if not future.done():
            setter(value)

    def work():
        try:
            result = _guarded_call(fn, args, kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting loop, which decides
            outcome = (future.set_exception, exc)
        else:
            outcome = (future.set_result, result)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the agents' loop is closed: nobody waits any more
            pass

    threading.Thread(target=work, name=f"npu-rl-user-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return future


def check_timeout(value: Any, where: str) -> float:
    """A deadline in seconds: a finite number > 0 (0, negative, NaN and inf would mean "never" or "at once")."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: timeout={value!r} must be a number of seconds > 0") from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{where}: timeout={value!r} must be a finite number of seconds > 0")
    return seconds


async def call_user_code(fn: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` (awaited when it is ``async``), off the agents' loop, cut at ``timeout_s``; raises
    ``UserCodeTimeout`` at the deadline and whatever ``fn`` raised otherwise."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        tool_loop = _tool_loop()
        try:
            pending = asyncio.run_coroutine_threadsafe(_guarded_coroutine(fn, args, kwargs), tool_loop.loop)
        except RuntimeError:  # that loop was given up meanwhile
            _give_up(tool_loop)
            tool_loop = _tool_loop()
            pending = asyncio.run_coroutine_threadsafe(_guarded_coroutine(fn, args, kwargs), tool_loop.loop)
        waiting = asyncio.wrap_future(pending)
    else:
        tool_loop = None
        waiting = _in_daemon_thread(fn, args, kwargs)
    try:
        return await asyncio.wait_for(waiting, timeout=timeout_s)
    except asyncio.TimeoutError:
        if tool_loop is not None:
            _give_up(tool_loop)
        raise UserCodeTimeout(f"did not answer within {timeout_s:g} s") from None


class _DaemonThreads(concurrent.futures.ThreadPoolExecutor):
    """The agents' loop's default executor (``asyncio.to_thread``, ``run_in_executor(None, ...)`` in a user's loop):
    one daemon thread per call, never joined, so a call that never returns holds neither the loop's shutdown nor the
    interpreter's exit (a ThreadPoolExecutor's threads are joined at both). asyncio insists on this base class."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        future: concurrent.futures.Future = concurrent.futures.Future()

        def work():
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits it
                future.set_exception(exc)

        threading.Thread(target=work, name=f"npu-rl-user-{getattr(fn, '__name__', 'call')}", daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=False)


def run_agents_loop(main: Any, grace_s: float = 1.0) -> Any:
    """``asyncio.run(main)``, except that what user code left behind is not waited for: tasks still pending when
    ``main`` returns are cancelled and given ``grace_s`` to end (one that swallows its cancellation is abandoned, and
    said), and threads started through the loop's executor are daemon threads nobody joins."""
    loop = asyncio.new_event_loop()
    loop.set_default_executor(_DaemonThreads())
    try:
        asyncio.set_event_loop(loop)
        with guard_exits():  # a user's agent loop runs on this thread: os._exit raises ExitAttempt (runner names it)
            return loop.run_until_complete(main)
    finally:
        try:
            left = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.wait(left, timeout=grace_s))
                stuck = [t for t in left if not t.done()]
                if stuck:
                    logger.warning("%d agent task(s) ignored their cancellation; abandoned: %s", len(stuck),
                                   ", ".join(t.get_name() for t in stuck))
                    for task in stuck:  # no "Task was destroyed but it is pending!" when they are collected
                        task._log_destroy_pending = False  # noqa: SLF001 - asyncio's own switch for this
            loop.run_until_complete(asyncio.wait([loop.create_task(loop.shutdown_asyncgens())], timeout=grace_s))
        finally:
            asyncio.set_event_loop(None)
            loop.close()
