"""The verl key table (``keys.yaml`` beside this file) and its classifier.

A key our schema has is *implemented*. Every other key of verl's tree (its generated ``ppo_trainer.yaml`` and the
older tree of verl 0.4 that many scripts still use) has an entry in the table:

- ``alias``: verl's name for one of our keys (or subtrees); the override is rewritten to ours.
- ``no_effect``: accepted and dropped, with the reason it changes nothing here.
- ``refused``: a feature npu-rl does not have (why, what to use instead). A value that leaves the feature off
  (None, False, 0, an empty string or collection, or one of the entry's ``off_values``) is accepted with a note.

An entry covers its key and every key below it; the most specific entry wins. Keys may be written as brace
patterns (``actor_rollout_ref.{actor,ref}.pad_to_length``), and a reason shared by several entries is written once
under ``reasons`` and referred to as ``'@name'``. ``by_leaf`` gives the status of any key whose last part is named
there (verl's ``_target_``); ``values`` lists values of our keys that verl has and npu-rl refuses (an engine).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
from dataclasses import dataclass
from typing import Any

import yaml

from npu_rl.config.introspect import named_entries, schema_fields
from npu_rl.config.schema import PPOConfig

KINDS = ("implemented", "alias", "no_effect", "refused", "unknown")
OFF_TEXT = ("", "null", "none", "None", "false", "False")


@dataclass(frozen=True)
class Entry:
    """One row of the table (after brace expansion)."""

    kind: str  # alias | no_effect | refused
    target: str = ""  # alias: our key
    why: str = ""  # no_effect / refused
    instead: str = ""  # refused
    off: tuple[Any, ...] = ()  # refused: values besides the generic ones that leave the feature off


@dataclass(frozen=True)
class KeyStatus:
    """How npu-rl treats one verl key."""

    kind: str  # implemented | alias | no_effect | refused | unknown
    key: str  # the key as given
    target: str | None = None  # alias: our key (after following aliases)
    why: str = ""  # no_effect / refused: the reason
    instead: str = ""  # refused: what to use instead


def expand_braces(pattern: str) -> list[str]:
    """``a.{b,c.{d,e}}.f`` -> ``a.b.f``, ``a.c.d.f``, ``a.c.e.f`` (bash's brace expansion, nesting allowed)."""
    start = pattern.find("{")
    if start < 0:
        return [pattern]
    depth, parts, begin = 0, [], start + 1
    for i in range(start, len(pattern)):
        if pattern[i] == "{":
            depth += 1
        elif pattern[i] == "}":
            depth -= 1
            if depth == 0:
                parts.append(pattern[begin:i])
                head, tail = pattern[:start], pattern[i + 1:]
                return [head + word + rest for part in parts for word in expand_braces(part)
                        for rest in expand_braces(tail)]
        elif pattern[i] == "," and depth == 1:
            parts.append(pattern[begin:i])
            begin = i + 1
    raise ValueError(f"keys.yaml: unbalanced braces in {pattern!r}")


def _reason(value: Any, reasons: dict[str, Any], where: str) -> Any:
    if isinstance(value, str) and value.startswith("@"):
        if value[1:] not in reasons:
            raise ValueError(f"keys.yaml: {where} refers to the unknown reason {value!r}")
        return reasons[value[1:]]
    return value


def _entry(kind: str, key: str, value: Any, reasons: dict[str, Any]) -> Entry:
    where = f"{kind}.{key}"
    if kind == "alias":
        return Entry("alias", target=value)
    if kind == "no_effect":
        why = _reason(value, reasons, where)
        if not isinstance(why, str) or not why:
            raise ValueError(f"keys.yaml: {where} needs a reason (a text or '@name')")
        return Entry("no_effect", why=why)
    if isinstance(value, dict) and "reason" in value:
        value = {**_reason("@" + value["reason"], reasons, where), **{k: v for k, v in value.items() if k != "reason"}}
    value = _reason(value, reasons, where)
    if not isinstance(value, dict) or not value.get("why") or not value.get("instead"):
        raise ValueError(f"keys.yaml: {where} needs why and instead")
    return Entry("refused", why=value["why"], instead=value["instead"], off=tuple(value.get("off_values", ())))


@functools.lru_cache(maxsize=1)
def table() -> dict[str, Entry]:
    """Every key of the table (braces expanded) -> its entry."""
    text = importlib.resources.files("npu_rl.compat.verl").joinpath("keys.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    reasons = data.get("reasons", {})
    out: dict[str, Entry] = {}
    for kind in ("alias", "no_effect", "refused"):
        for pattern, value in (data.get(kind) or {}).items():
            for key in expand_braces(pattern):
                if key in out:
                    raise ValueError(f"keys.yaml: {key!r} is listed twice")
                out[key] = _entry(kind, key, value, reasons)
    return out


@functools.lru_cache(maxsize=1)
def by_leaf() -> dict[str, Entry]:
    text = importlib.resources.files("npu_rl.compat.verl").joinpath("keys.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    return {leaf: _entry("no_effect", leaf, why, data.get("reasons", {}))
            for leaf, why in (data.get("by_leaf") or {}).items()}


@functools.lru_cache(maxsize=1)
def ascend_notes() -> dict[str, str]:
    """key (or subtree) -> how it behaves differently on Ascend NPUs (docs/npu.md)."""
    text = importlib.resources.files("npu_rl.compat.verl").joinpath("keys.yaml").read_text(encoding="utf-8")
    return dict(yaml.safe_load(text).get("ascend") or {})


@functools.lru_cache(maxsize=1)
def value_table() -> dict[str, dict[Any, Entry]]:
    """key -> {value verl accepts there that npu-rl does not -> its refusal} (``values:`` in keys.yaml)."""
    text = importlib.resources.files("npu_rl.compat.verl").joinpath("keys.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    reasons = data.get("reasons", {})
    out: dict[str, dict[Any, Entry]] = {}
    for pattern, values in (data.get("values") or {}).items():
        for key in expand_braces(pattern):
            out[key] = {value: _entry("refused", f"{key}={value}", refusal, reasons) for value, refusal in
                        values.items()}
    return out


def refused_value(key: str, value: Any) -> Entry | None:
    """The refusal of ``value`` for our ``key`` where it is a value verl has and npu-rl does not (``sglang``)."""
    try:
        return value_table().get(key, {}).get(value)
    except TypeError:  # a list or dict value: no value of the table is one
        return None


def lookup(key: str, entries: dict[str, Any]) -> str | None:
    """The most specific entry of ``entries`` covering ``key`` (the key itself or a subtree above it)."""
    parts = key.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in entries:
            return candidate
    return None


def implemented(key: str) -> bool:
    """Whether the schema has ``key`` (a typed field, or an entry inside one of its free-form dicts)."""
    node: Any = PPOConfig
    parts = key.split(".")
    i = 0
    while i < len(parts):
        if not dataclasses.is_dataclass(node):
            return True  # inside a free-form dict
        fields = schema_fields(node)
        if parts[i] not in fields:
            return False
        node = fields[parts[i]]
        if named_entries(node) is not None and i + 1 < len(parts):  # skip the entry's name (any name)
            node, i = named_entries(node), i + 1
        i += 1
    return True


# Dicts of named entries whose table rows are written for one entry name: a key under any other name is classified
# as that entry's (distillation.teacher_models.gsm8k.inference.name as ...teacher_model.inference.name)
NAMED_ENTRY_ROWS = {"distillation.teacher_models": "teacher_model"}


def _as_row_entry(key: str) -> tuple[str, str, str] | None:
    """(the key under the rows' entry name, that name, the key's own entry name), or None."""
    for prefix, row_name in NAMED_ENTRY_ROWS.items():
        if key.startswith(prefix + "."):
            name, _, rest = key[len(prefix) + 1:].partition(".")
            if rest and name != row_name:
                return f"{prefix}.{row_name}.{rest}", f"{prefix}.{row_name}.", f"{prefix}.{name}."
    return None


def classify(key: str, _depth: int = 0) -> KeyStatus:
    """The status of ``key`` (no ``+``/``~`` prefix). Aliases are followed to what they land on."""
    renamed = _as_row_entry(key)
    if renamed is not None:
        row_key, row_prefix, own_prefix = renamed
        status = classify(row_key, _depth)
        target = status.target.replace(row_prefix, own_prefix, 1) if status.target else status.target
        return dataclasses.replace(status, key=key, target=target)
    leaf = key.rpartition(".")[2]
    if leaf in by_leaf():
        return KeyStatus("no_effect", key, why=by_leaf()[leaf].why)
    entries = table()
    found = lookup(key, entries)
    entry = entries[found] if found else None
    if entry is not None and entry.kind == "alias" and _depth < 4:
        target = entry.target + key[len(found):]
        landed = classify(target, _depth + 1)
        if landed.kind in ("implemented", "alias"):
            return KeyStatus("alias", key, target=landed.target or target)
        return KeyStatus(landed.kind, key, target=target, why=landed.why, instead=landed.instead)
    if implemented(key):
        return KeyStatus("implemented", key, target=key)
    if entry is None:
        return KeyStatus("unknown", key)
    return KeyStatus(entry.kind, key, why=entry.why, instead=entry.instead)


def is_off(key: str, value: Any) -> bool:
    """Whether ``value`` leaves the feature behind a refused ``key`` switched off."""
    if value is None or value is False or value == 0 or value in OFF_TEXT:
        return True
    if isinstance(value, (list, tuple, dict)) and not value:
        return True
    found = lookup(key, table())
    return found is not None and value in table()[found].off


def entries_by_kind() -> dict[str, str]:
    """Every table key -> its kind (for docs and tests)."""
    return {key: entry.kind for key, entry in table().items()}
