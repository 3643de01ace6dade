"""Several reward functions as one (the Python API's ``reward_funcs=[...]``, as in TRL): each is named by reference,
``path/to/file.py:name`` or ``package.module:name``, so the pool workers load them themselves, or is a ``.pkl`` file
the Python API wrote for a callable without such a name (a partial, a callable object, a nested function: pickled by
``npu_rl.api`` and read here like a reward file, as code the user chose to run).

The score is ``sum_i w_i * score_i`` (weights default to 1, as TRL's ``reward_weights``); each function's score is
logged under its name, and with a single function its dict (``score`` and extras) is passed through unchanged. The
functions take verl's signature: ``fn(data_source, solution_str, ground_truth, extra_info=None, **kwargs)``.
"""

from __future__ import annotations

import os
import pickle
from typing import Any, Optional

from npu_rl.reward.score_fn import RewardFunctionError, to_score_dict
from npu_rl.utils.imports import load_object

_LOADED: dict[str, Any] = {}


def _function(ref: str):
    if ref not in _LOADED:
        if ref.endswith(".pkl"):
            with open(ref, "rb") as f:
                _LOADED[ref] = pickle.load(f)
        else:
            _LOADED[ref] = load_object(ref)
    return _LOADED[ref]


def function_name(ref: str) -> str:
    """A reference's short name (its metric name): ``name`` of ``source:name``; ``label`` of ``.../N-label.pkl``."""
    if ref.endswith(".pkl"):
        return os.path.basename(ref)[: -len(".pkl")].partition("-")[2] or os.path.basename(ref)
    return ref.rpartition(":")[2]


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, reward_funcs: list[str],
                  reward_weights: Optional[list[float]] = None, **kwargs) -> dict[str, Any]:
    weights = list(reward_weights) if reward_weights else [1.0] * len(reward_funcs)
    if len(weights) != len(reward_funcs):
        raise ValueError(f"reward_weights has {len(weights)} entries for {len(reward_funcs)} reward functions")
    results = []
    for ref in reward_funcs:
        try:
            result = _function(ref)(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                                    extra_info=extra_info, **kwargs)
        except Exception as exc:  # named as the user's function, not as this wrapper (the manager adds the row)
            raise RewardFunctionError(f"reward function {ref} raised {type(exc).__name__}: {exc}") from exc
        results.append(to_score_dict(result, f"reward function {ref}"))
    if len(results) == 1 and weights[0] == 1.0:
        return results[0]
    out: dict[str, Any] = {"score": sum(w * r["score"] for w, r in zip(weights, results))}
    for ref, result in zip(reward_funcs, results):
        out[function_name(ref)] = result["score"]
    return out
