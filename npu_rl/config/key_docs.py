"""The config key table (docs/config_keys.md), generated from the schema: every key, its type, its default and
what it does. ``python -m npu_rl.config.key_docs > docs/config_keys.md`` regenerates the page; a test keeps
the committed page equal to this output.

The description of a key is the docstring under its field (a string right after the annotated assignment in the
dataclass body, as torchtitan writes them), read from the module's source with :mod:`ast`; keys without one say
nothing (they mean what they mean in verl). A docstring that starts with :data:`NO_EFFECT` marks a key kept for verl
scripts that changes nothing here; :func:`ignored_settings` notes such keys when a run sets them.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import sys
import typing

from npu_rl.config import schema
from npu_rl.config.async_schema import async_notes
from npu_rl.config.introspect import named_entries

NO_EFFECT = "no effect in npu-rl (kept for verl scripts): "


@functools.lru_cache(maxsize=None)
def _module_docs(module_name: str) -> dict[str, dict[str, str]]:
    """``{class: {field: docstring}}`` of every dataclass in a module."""
    tree = ast.parse(inspect.getsource(sys.modules[module_name]))
    out: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        docs = out.setdefault(node.name, {})
        for field, nxt in zip(node.body, node.body[1:]):
            if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name) \
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) \
                    and isinstance(nxt.value.value, str):
                docs[field.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
    return out


def field_docs(cls) -> dict[str, str]:
    """``{field: docstring}`` of a config dataclass."""
    return _module_docs(cls.__module__).get(cls.__name__, {})


def no_effect_keys(cls=None, prefix: str = "") -> dict[str, str]:
    """``{key: why}`` for every key whose docstring says it has no effect here."""
    cls = cls or schema.PPOConfig
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    out = {}
    for f in dataclasses.fields(cls):
        tp = hints.get(f.name, f.type)
        if dataclasses.is_dataclass(tp):
            out |= no_effect_keys(tp, f"{prefix}{f.name}.")
        elif named_entries(tp) is not None and f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            for name in f.default_factory():  # type: ignore[misc]  (the entries every config has)
                out |= no_effect_keys(named_entries(tp), f"{prefix}{f.name}.{name}.")
        elif docs.get(f.name, "").startswith(NO_EFFECT):
            out[f"{prefix}{f.name}"] = docs[f.name][len(NO_EFFECT):]
    return out


def ignored_settings(config, baseline=None) -> list[str]:
    """Notes for keys set to a non-default value that have no effect here. ``baseline``: the config the user started
    from (a config file we ship, before their overrides), so only what the user changed gets a note."""
    from omegaconf import OmegaConf

    defaults = OmegaConf.structured(baseline if baseline is not None else schema.PPOConfig)
    current = OmegaConf.structured(config)
    notes = []
    for key, why in no_effect_keys().items():
        if key == "actor_rollout_ref.hybrid_engine" and config.async_training.mode != "sync":
            continue  # the asynchronous trainers read it (config/async_schema.py)
        value = OmegaConf.select(current, key)
        default = OmegaConf.select(defaults, key, throw_on_resolution_failure=False)
        if value != default:
            notes.append(f"{key}={value!r} has no effect in npu-rl: {why}")

    notes += async_notes(config, defaults, current)
    tokenizer_path = config.critic.model.tokenizer_path
    if tokenizer_path not in (None, config.actor_rollout_ref.model.path):
        notes.append(f"critic.model.tokenizer_path={tokenizer_path!r} has no effect in npu-rl: the critic scores the "
                     "actor's tokens with the actor's tokenizer")
    return notes


def _type_name(tp) -> str:
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Union and type(None) in args:
        return " or ".join(_type_name(a) for a in args if a is not type(None)) + " or None"
    if tp is typing.Any:
        return "any"
    if typing.get_origin(tp) is not None:
        return str(tp).replace("typing.", "")
    return getattr(tp, "__name__", str(tp))


def walk(cls=None, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every leaf key, in schema order."""
    cls = cls or schema.PPOConfig
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    rows = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints.get(f.name, f.type)
        if dataclasses.is_dataclass(tp):
            rows += walk(tp, key + ".")
            continue
        if named_entries(tp) is not None:  # a dict of named entries: the entry's keys under <name>
            rows.append((key, "dict of entries", ", ".join(f.default_factory()), docs.get(f.name, "")))
            rows += walk(named_entries(tp), key + ".<name>.")
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        else:
            default = "(required)"
        desc = docs.get(f.name, "")
        rows.append((key, _type_name(tp), repr(default) if not isinstance(default, str) else default, desc))
    return rows


def markdown() -> str:
    lines = [
        "# Config keys",
        "",
        "Every key of the config tree with its type, its default and what it does, generated from the docstrings",
        "under the fields of `npu_rl/config/schema.py` (`python -m npu_rl.config.key_docs > docs/config_keys.md`;",
        "a test keeps this page in step). Keys are verl's; where npu-rl's default differs from verl's the description",
        "says so. A key with no description here means what it means in verl. `${...}` defaults follow another key",
        "unless set. `npu-rl train --cfg job` prints the resolved values of a run; docs/configuration.md explains how",
        "configs are composed.",
        "",
    ]
    section = None
    for key, tp, default, desc in walk():
        parts = key.split(".")
        top = ".".join(parts[:2]) if parts[0] == "actor_rollout_ref" and len(parts) > 2 else parts[0]
        if top != section:
            section = top
            lines += ["", f"## {section}", "", "| key | type | default | what it does |", "| --- | --- | --- | --- |"]
        cell = default.replace("|", "\\|")
        lines.append(f"| `{key}` | {tp.replace('|', '/')} | `{cell}` | {desc.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
