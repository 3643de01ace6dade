"""Reading the schema's dataclasses: the typed fields of a config class (shared by the loader's key checks and the
verl key table, which must not import each other)."""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any


def unwrap_optional(tp: Any) -> Any:
    """Optional[X] -> X."""
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def named_entries(tp: Any) -> Any:
    """The entry class of a ``dict[str, <config dataclass>]`` field (named entries of one schema, e.g.
    ``distillation.teacher_models.<name>``), else None."""
    if typing.get_origin(tp) is dict:
        args = typing.get_args(tp)
        if len(args) == 2 and dataclasses.is_dataclass(args[1]):
            return args[1]
    return None


@functools.lru_cache(maxsize=None)
def schema_fields(cls: type) -> dict[str, Any]:
    """``{field name: type}`` of a config dataclass, Optional unwrapped."""
    hints = typing.get_type_hints(cls)
    return {f.name: unwrap_optional(hints[f.name]) for f in dataclasses.fields(cls)}
