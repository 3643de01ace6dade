"""The rules a config slice keeps about its own keys: each dataclass of the schema may define ``check(key)`` (``key``:
where the slice sits in the tree, e.g. ``critic.optim``) returning one problem per broken rule, each naming the
full key and what to change. :func:`slice_problems` walks the tree and asks every slice.

Which names a key may take (engines, estimators, loggers ...) is not a rule of the slice: the code that implements
the names holds their list, and the preflight (``npu_rl.trainer.preflight``) asks it there.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


def finite(value: Any) -> bool:
    """A real number that is neither inf nor nan (bool is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def broken(*rules: tuple[bool, str]) -> list[str]:
    """The messages of the rules that do not hold: ``broken((ok, "message"), ...)``."""
    return [message for ok, message in rules if not ok]


def slice_problems(node: Any, key: str = "") -> list[str]:
    """Every slice's ``check(key)`` under ``node`` (a config dataclass), parents before their children."""
    problems = list(node.check(key.rstrip("."))) if hasattr(node, "check") else []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            problems += slice_problems(value, f"{key}{f.name}.")
    return problems
