"""The reward function a manager calls: the default rule scorers, or a user's function loaded by file path.

A ``ScoreFnSpec`` names the function (file + name) instead of holding it, so it pickles as a few strings and every
process (the trainer, a Ray worker, a reward-pool worker) loads the function itself: nothing user-defined is ever
pickled, which is what broke custom rewards under Ray for verl users (#3150).

The user's function has verl's signature, called with keyword arguments::

    compute_score(data_source, solution_str, ground_truth, extra_info=None, **reward_kwargs) -> float | dict

(a dict must hold ``score``; its other entries are logged; an ``async def`` is run to completion per call, as
verl's reward loop awaits one). With the ``batch`` manager it takes lists::

    compute_score(data_sources, solution_strs, ground_truths, extra_infos, **reward_kwargs) -> list[float | dict]

``run_score_fn`` calls it and checks what comes back: NaN/inf (or a number the step cannot compute with in float32,
|score| > 1e15: 3e38 fits a float32 but not its square), a
wrong type or a dict without ``score`` raise
``RewardFunctionError`` naming the function, never a silently wrong score.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import math
import numbers
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from npu_rl.reward import scorers
from npu_rl.utils.imports import load_module_from_file, verl_import_hint

ROW_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
BATCH_ARGS = ("data_sources", "solution_strs", "ground_truths", "extra_infos")


class RewardFunctionError(ValueError):
    """A reward function failed, or returned something that is not a score."""


@dataclass(frozen=True)
class ScoreFnSpec:
    path: Optional[str] = None  # a Python file; None: npu-rl's default rule scorers
    name: str = "compute_score"
    kwargs: dict[str, Any] = field(default_factory=dict)
    batched: bool = False  # the batch manager's list signature

    def describe(self) -> str:
        if self.path is None:
            return "default_compute_score (npu_rl.reward.scorers)"
        return f"function {self.name!r} in {os.path.abspath(os.path.expanduser(self.path))}"

    def load(self) -> Callable[..., Any]:
        """The callable, loaded in this process; errors name the file and the function."""
        if self.path is None:
            return scorers.default_batch_compute_score if self.batched else scorers.default_compute_score
        path = os.path.abspath(os.path.expanduser(self.path))
        if os.path.isdir(path):
            raise RewardFunctionError(f"custom_reward_function.path: {path} is a folder; give the .py file inside it "
                                      f"that defines {self.name!r}")
        if not os.path.isfile(path):
            raise RewardFunctionError(f"custom_reward_function.path: file {path} does not exist "
                                      f"(looking for function {self.name!r})")
        try:
            module = load_module_from_file(path)
        except SystemExit as exc:  # else `npu-rl train` would exit with this code having trained nothing
            raise RewardFunctionError(f"custom_reward_function.path: importing {path} called sys.exit({exc.code!r}); "
                                      "a reward module must not exit the process") from None
        except Exception as exc:
            raise RewardFunctionError(f"custom_reward_function.path: cannot import {path}: {exc}"
                                      f"{verl_import_hint(exc)}") from exc
        fn = getattr(module, self.name, None)
        if fn is None:
            public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
            raise RewardFunctionError(f"custom_reward_function.name: {path} has no function {self.name!r}; "
                                      f"it defines {public}")
        if not callable(fn):
            raise RewardFunctionError(f"custom_reward_function.name: {self.name!r} in {path} is a "
                                      f"{type(fn).__name__}, not a function")
        if _is_async(fn):
            fn = run_to_completion(fn)
        check_signature(fn, self)
        return fn


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def run_to_completion(fn: Callable[..., Any]) -> Callable[..., Any]:
    """An ``async def`` reward function (verl's reward loop awaits them: FAPO's ``compute_score_baseline``) as a
    plain function: each call runs the coroutine to its end on an event loop of its own, in this thread, or in a
    thread of its own when this thread already runs a loop. The managers' per-call timeout covers it as any call."""
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(fn(*args, **kwargs))
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="npu-rl-async-reward") as pool:
            return pool.submit(lambda: asyncio.run(fn(*args, **kwargs))).result()

    return call


def check_signature(fn: Callable[..., Any], spec: ScoreFnSpec) -> None:
    """The function must accept the manager's keyword call; fail naming file, function and the expected call."""
    args = BATCH_ARGS if spec.batched else ROW_ARGS
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and some C callables have no signature: nothing to check
    try:
        signature.bind(**{a: None for a in args}, **spec.kwargs)
    except TypeError as exc:
        kwargs = f", **{sorted(spec.kwargs)}" if spec.kwargs else ""
        raise RewardFunctionError(
            f"{spec.describe()} has the signature {spec.name}{signature}, which cannot be called as "
            f"{spec.name}({', '.join(a + '=...' for a in args)}{kwargs}): {exc}. "
            + ("The batch reward manager passes lists. " if spec.batched else "")
            + "Expected verl's signature: compute_score(" + ", ".join(args[:3]) + f", {args[3]}=None, **kwargs)."
        ) from exc


def to_score_dict(result: Any, where: str) -> dict[str, Any]:
    """A float or a dict with ``score`` -> a dict with a finite float ``score``; anything else raises."""
    if isinstance(result, dict):
        if "score" not in result:
            raise RewardFunctionError(f"{where} returned a dict without 'score' (keys {sorted(result)})")
        out = dict(result)
        out["score"] = _finite(result["score"], where)
        return out
    score = _finite(result, where)
    return {"score": score, "acc": score}  # verl logs a bare float as acc too


# Scores are summed, averaged and normalised by their group's std in float32 (largest finite value 3.4e38): a score
# of 3e38 fits a float32 but the sum of two, or its square in the std, does not (the step's advantages become NaN
# and nothing trains). At 1e15 the square is 1e30, so even 10^8 of them sum within float32.
MAX_SCORE = 1.0e15


def _finite(value: Any, where: str) -> float:
    if isinstance(value, bool) or isinstance(value, numbers.Real) or _is_scalar_array(value):
        score = float(value)
        if not math.isfinite(score):
            raise RewardFunctionError(f"{where} returned a non-finite score {score}")
        if abs(score) > MAX_SCORE:  # scores live in float32 tensors: 1e308 would become inf there
            raise RewardFunctionError(f"{where} returned the score {score:g}, beyond what the step can compute with "
                                      f"(|score| <= {MAX_SCORE:g}: scores are summed, and squared for the group's "
                                      "std, in float32); scale the reward down")
        return score
    raise RewardFunctionError(f"{where} returned a {type(value).__name__} ({value!r:.80}); expected a float or a "
                              "dict with a float 'score'")


def _is_scalar_array(value: Any) -> bool:
    # a 0-d NumPy / torch value (np.float32, torch.tensor(1.0)); never a longer array
    shape = getattr(value, "shape", None)
    return shape is not None and tuple(shape) in ((), (1,)) and hasattr(value, "__float__")


def run_score_fn(fn: Callable[..., Any], spec: ScoreFnSpec, payload: dict[str, Any]) -> Any:
    """Call ``fn`` on one row (or, batched, one chunk of rows) and check the result(s)."""
    result = fn(**payload, **spec.kwargs)
    if not spec.batched:
        return to_score_dict(result, spec.describe())
    num_rows = len(payload["solution_strs"])
    if not isinstance(result, (list, tuple)) or len(result) != num_rows:
        got = f"{type(result).__name__} of length {len(result)}" if hasattr(result, "__len__") \
            else type(result).__name__
        raise RewardFunctionError(f"{spec.describe()} returned a {got}; the batch manager expects a list of "
                                  f"{num_rows} scores, one per row")
    return [to_score_dict(r, f"{spec.describe()} (row {i} of the chunk)") for i, r in enumerate(result)]
