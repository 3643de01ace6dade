"""The rules a config slice keeps about its own keys: each dataclass of the schema may define ``check(key)`` (``key``:
where the slice sits in the tree, e.g. ``critic.optim``) returning one problem per broken rule, each naming the
full key and what to change. :func:`slice_problems` walks the tree and asks every slice.

One rule holds for every key of the schema typed ``float`` (or a list of floats, or Optional): its value is a finite
number. NaN and inf mean nothing a run can use (a NaN ``min_lr_ratio`` skips every update; an infinite ``eps``
fails inside the optimizer after the models load), so they are refused by this rule, naming the key, wherever a
slice's own rules say nothing about that key. A slice's ``check`` adds the ranges (``> 0``, ``[0, 1]`` ...).

Which names a key may take (engines, estimators, loggers ...) is not a rule of the slice: the code that implements
the names holds their list, and the preflight (``npu_rl.trainer.preflight``) asks it there.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Any


def finite(value: Any) -> bool:
    """A real number that is neither inf nor nan (bool is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def broken(*rules: tuple[bool, str]) -> list[str]:
    """The messages of the rules that do not hold: ``broken((ok, "message"), ...)``."""
    return [message for ok, message in rules if not ok]


def pool_size_rules(key: str, nnodes: int, n_gpus_per_node: int, own_pool: bool) -> list[tuple[bool, str]]:
    """A role's own resource pool (``<key>.nnodes`` x ``<key>.n_gpus_per_node`` devices): both counts >= 1 when the
    role runs there, and never negative."""
    return [(nnodes >= 0, f"{key}.nnodes={nnodes} must be >= 0"),
            (not own_pool or (nnodes >= 1 and n_gpus_per_node >= 1),
             f"{key}: its own resource pool needs {key}.nnodes >= 1 and {key}.n_gpus_per_node >= 1 (got nnodes="
             f"{nnodes}, n_gpus_per_node={n_gpus_per_node})")]


@functools.lru_cache(maxsize=None)
def _float_fields(cls: type) -> tuple[tuple[str, bool], ...]:
    """(name, is a list) of the fields of ``cls`` typed float, Optional[float], list[float] or Optional[list[float]]."""
    out = []
    for name, hint in typing.get_type_hints(cls).items():
        args = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) is typing.Union \
            else [hint]
        if len(args) != 1:
            continue
        (inner,) = args
        if inner is float:
            out.append((name, False))
        elif typing.get_origin(inner) is list and typing.get_args(inner) == (float,):
            out.append((name, True))
    return tuple(out)


def non_finite_problems(node: Any, key: str, own: list[str]) -> list[str]:
    """The one rule of every float key (module docstring): keys a message in ``own`` already names are skipped."""
    problems = []
    for name, is_list in _float_fields(type(node)):
        value = getattr(node, name)
        values = value if is_list and isinstance(value, (list, tuple)) else [value]
        full = f"{key}{name}"
        if value is None or all(finite(v) for v in values) or any(p.startswith(f"{full}=") for p in own):
            continue
        problems.append(f"{full}={value} must be a finite number (NaN and inf are not values a run can use)")
    return problems


def slice_problems(node: Any, key: str = "") -> list[str]:
    """Every slice's ``check(key)`` under ``node`` (a config dataclass), parents before their children, and the
    finite-number rule of every float key."""
    problems = list(node.check(key.rstrip("."))) if hasattr(node, "check") else []
    problems += non_finite_problems(node, key, problems)
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            problems += slice_problems(value, f"{key}{f.name}.")
    return problems
