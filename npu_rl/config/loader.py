"""Compose a config from ``configs/`` + command-line overrides, with errors that say what to change.

Order of precedence (lowest first): the dataclass defaults (``schema.py``), the chosen YAML (``--config-name``,
default ``ppo_trainer``), a preset (``preset=grpo``), then ``key=value`` overrides. Before Hydra sees an override we
check its key against the schema, so a misspelt key fails naming the closest valid one, including ``+key=value``
(Hydra would accept a force-added key silently).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.resources
import os
import re
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from npu_rl.config.errors import ConfigError
from npu_rl.config.introspect import named_entries, schema_fields as _fields
from npu_rl.config.schema import PPOConfig
from npu_rl.utils.redact import ENV_KEYS_ATTRIBUTE, env_interpolated_keys, mark_env_keys, mask_env_values, redact_mapping

__all__ = ["ConfigError", "all_keys", "check_key", "compose", "load_config", "suggest_key", "to_dataclass", "to_yaml"]

SCHEMA_NAME = "npu_rl_schema"
CONFIG_GROUPS = ("preset",)  # Hydra groups under configs/ selectable as group=name


def config_dir() -> str:
    return str(importlib.resources.files("npu_rl.configs"))


def available_config_names(path: str | None = None) -> list[str]:
    folder = path or config_dir()
    return sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".yaml"))


# ------------------------------------------------------------------------------------------- schema introspection
@functools.lru_cache(maxsize=1)
def all_keys() -> tuple[str, ...]:
    """Every key path of the schema, leaves and inner nodes."""
    out: list[str] = []

    def walk(cls: type, prefix: str) -> None:
        for name, tp in _fields(cls).items():
            path = f"{prefix}{name}"
            out.append(path)
            if dataclasses.is_dataclass(tp):
                walk(tp, path + ".")

    walk(PPOConfig, "")
    return tuple(out)


def suggest_key(key: str) -> str | None:
    """The closest valid key: a sibling spelt alike, then the same leaf elsewhere in the tree, then by spelling."""
    keys = all_keys()
    parent, _, leaf = key.rpartition(".")
    sibling_leaves = [k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == parent]
    close = [s for s in sibling_leaves if len(leaf) >= 3 and s.startswith(leaf)]  # a truncated name: temp
    close = close or difflib.get_close_matches(leaf, sibling_leaves, n=1, cutoff=0.6)
    if close:
        return f"{parent}.{close[0]}" if parent else close[0]
    same_leaf = [k for k in keys if k.rpartition(".")[2] == leaf]
    if same_leaf:
        return difflib.get_close_matches(key, same_leaf, n=1, cutoff=0.0)[0]
    candidates = [k for k in keys if not key.startswith(k + ".")]  # a parent of the key is no suggestion
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.75)
    return close[0] if close else None


def check_key(key: str) -> bool:
    """Whether ``key`` names something in the schema. Returns True if it exists as a typed field (an entry of a dict
    of config dataclasses, ``distillation.teacher_models.<name>.model_path``, included), False if it lies inside a
    free-form dict (e.g. ``model.override_config.attention_dropout``). Raises ConfigError if unknown."""
    node: Any = PPOConfig
    parts = key.split(".")
    i = 0
    while i < len(parts):
        if not dataclasses.is_dataclass(node):
            return False  # inside a dict / Any: free-form
        fields = _fields(node)
        if parts[i] not in fields:
            hint = suggest_key(key)
            where = ".".join(parts[:i]) or "the top level"
            msg = f"unknown config key {key!r} ({parts[i]!r} is not a key of {where})"
            raise ConfigError(msg + (f"; did you mean {hint!r}?" if hint else ""))
        node = fields[parts[i]]
        entry = named_entries(node)
        if entry is not None and i + 1 < len(parts):  # the next part is an entry's name: any name
            node, i = entry, i + 1
        i += 1
    return True


# -------------------------------------------------------------------------------------------------- overrides
def _check_group_choice(group: str, choice, config_path: str | None) -> list[str]:
    folder = os.path.join(config_path or config_dir(), group)
    names = available_config_names(folder) if os.path.isdir(folder) else []
    if choice is None or choice in names:
        return []
    return [f"{group}={choice!r} does not exist; available: {', '.join(names)}"]


def quote_query_value(override: str) -> str:
    """``key=path?split=train`` -> ``key='path?split=train'``: Hydra's grammar refuses an unquoted ``=`` in a value,
    and a data path's query (``hf://datasets/o/n?split=train``, ``folder?split=test``) has one."""
    key, sep, value = override.partition("=")
    if not sep or not value or value[0] in "'\"[{" or "'" in value or not re.search(r"\?[\w]+=", value):
        return override
    return f"{key}='{value}'"


def normalise_overrides(overrides: list[str], config_path: str | None = None) -> list[str]:
    """Check every override's key; turn ``+key=v`` for a key the schema already has into ``++key=v``.

    verl users write ``+actor_rollout_ref.actor.foo=...`` for keys their verl version lacked; here the key may
    exist, and Hydra would refuse to add it twice. A key inside a free-form dict (``ray_kwargs.ray_init.runtime_env
    .py_executable``) needs no ``+``. Keys of verl's tree that are not ours are translated before this
    (:func:`npu_rl.compat.verl.translate.translate_overrides`, called by the entry points).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = [quote_query_value(o) for o in overrides]
    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(overrides)
    except Exception:  # Hydra's grammar errors: find the override that fails and say how to quote it
        for text in overrides:
            try:
                parser.parse_overrides([text])
            except Exception as exc:
                first_line = str(exc).split("\n")[0]
                raise ConfigError(f"cannot parse the override {text!r} ({first_line}); quote a value with special "
                                  "characters (= ? & , [ ] { } : spaces): key='value'") from exc
        raise
    problems, out = [], []
    for text, override in zip(overrides, parsed):
        key = override.key_or_group
        if key in CONFIG_GROUPS:
            problems.extend(_check_group_choice(key, override.value(), config_path))
            out.append(text)
            continue
        if key.startswith("hydra"):
            out.append(text)
            continue
        try:
            typed = check_key(key)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        if override.is_add() and not override.is_force_add() and typed:
            text = "+" + text
        elif not typed and not (override.is_add() or override.is_delete()):
            text = "++" + text  # a new entry of a free-form dict: Hydra would want '+'
        out.append(text)
    if problems:
        raise ConfigError(problems)
    return out


def _in_named_entry(key: str) -> bool:
    """Whether ``key`` lies inside an entry of a dict of config dataclasses (``distillation.teacher_models.<name>.*``)."""
    node: Any = PPOConfig
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if not dataclasses.is_dataclass(node):
            return False
        node = _fields(node).get(part)
        if named_entries(node) is not None:
            return depth + 1 < len(parts)  # an entry or a key inside one (not the whole dict)
    return False


def _entry_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(the overrides for Hydra, ``key=value`` lines setting keys of named entries). Hydra's ``+a.<new name>.b=v``
    builds the new entry as a plain dict, which a dict typed by a dataclass refuses; OmegaConf's merge builds it as
    that dataclass, so those are merged after composing."""
    hydra, entries = [], []
    for text in overrides:
        key, sep, _ = text.lstrip("+").partition("=")
        if sep and not text.startswith("~") and _in_named_entry(key):
            entries.append(text.lstrip("+"))
        else:
            hydra.append(text)
    return hydra, entries


def _merge_entries(cfg: DictConfig, entries: list[str]) -> DictConfig:
    """``cfg`` with the named entries' keys set; a new entry is built as its dataclass (unknown keys inside it are
    still refused)."""
    from omegaconf import open_dict

    update = OmegaConf.from_dotlist(entries)
    for key in dict.fromkeys(line.partition("=")[0] for line in entries):  # in the order written
        parent = key.split(".")
        for end in range(1, len(parent)):
            node = OmegaConf.select(cfg, ".".join(parent[:end]))
            if isinstance(node, DictConfig) and named_entries(_type_at(".".join(parent[:end]))) is not None:
                with open_dict(node):
                    name = parent[end]
                    if name not in node:
                        node[name] = OmegaConf.structured(named_entries(_type_at(".".join(parent[:end]))))
                break
    return OmegaConf.merge(cfg, update)


def _type_at(key: str) -> Any:
    node: Any = PPOConfig
    for part in key.split("."):
        node = _fields(node)[part]
    return node


_registered: list[type] = []  # the schema class last stored, so that a reloaded schema module is stored again


def _register_schema() -> None:
    """Stores the schema in Hydra's ConfigStore once a process: structuring it costs ~0.5 s (on 2 cores), every
    compose paid that before, and the store hands each compose a deep copy (ConfigStore.load), so one stays clean."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    if _registered != [PPOConfig] or f"{SCHEMA_NAME}.yaml" not in store.repo:
        store.store(name=SCHEMA_NAME, node=PPOConfig)
        _registered[:] = [PPOConfig]


def compose(overrides: list[str] | None = None, config_name: str = "ppo_trainer",
            config_path: str | None = None, notes: list[str] | None = None) -> DictConfig:
    """The composed (unresolved) config; raises ConfigError naming bad keys or values."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    folder = os.path.abspath(os.path.expanduser(config_path)) if config_path else config_dir()
    if not os.path.isdir(folder):
        raise ConfigError(f"--config-path {config_path!r}: {folder} is not a folder (give the folder holding "
                          f"{config_name}.yaml)")
    overrides = normalise_overrides(list(overrides or []), folder)
    if not os.path.isfile(os.path.join(folder, f"{config_name}.yaml")):
        raise ConfigError(
            f"no config named {config_name!r} in {folder}; available: {', '.join(available_config_names(folder))}"
        )
    _register_schema()
    GlobalHydra.instance().clear()
    try:
        hydra_overrides, entries = _entry_overrides(overrides)
        with initialize_config_dir(config_dir=folder, version_base=None):
            cfg = hydra_compose(config_name=config_name, overrides=hydra_overrides)
        return _merge_entries(cfg, entries) if entries else cfg
    except Exception as exc:
        raise ConfigError(_explain(exc)) from exc
    finally:
        GlobalHydra.instance().clear()


def _explain(exc: BaseException) -> str:
    """Hydra wraps OmegaConf's errors; find the innermost one and phrase it with the full key."""
    inner: BaseException = exc
    while inner.__cause__ is not None:
        inner = inner.__cause__
    if isinstance(inner, OmegaConfBaseException):
        key = getattr(inner, "full_key", None)
        msg = str(inner).split("\n")[0]
        return f"{key}: {msg}" if key else msg
    return str(exc).split("\n")[0] if str(exc) else repr(exc)


def to_dataclass(cfg: DictConfig) -> PPOConfig:
    """Resolve interpolations and build the typed config object, which remembers the places filled from the
    environment (``${oc.env:...}``): every record of the config masks them (``npu_rl.utils.redact``)."""
    try:
        config = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        raise ConfigError(_explain(exc)) from exc
    return mark_env_keys(config, env_interpolated_keys(OmegaConf.to_container(cfg, resolve=False)))


def load_config(overrides: list[str] | None = None, config_name: str = "ppo_trainer",
                config_path: str | None = None, notes: list[str] | None = None) -> PPOConfig:
    """Compose and resolve: the typed config, as written (nothing derived, nothing changed, nothing checked beyond
    the keys and their types; ``npu_rl.trainer.preflight.load_checked`` adds the plan and every check).

    ``notes`` (a list) receives one line per verl key that was renamed or dropped.
    """
    return to_dataclass(compose(overrides, config_name, config_path, notes))


def to_yaml(config: PPOConfig | DictConfig) -> str:
    """The config as YAML to print (``--cfg job``): interpolations left as written, secrets masked."""
    node = OmegaConf.structured(config) if dataclasses.is_dataclass(config) else config
    tree = mask_env_values(OmegaConf.to_container(node, resolve=False), getattr(config, ENV_KEYS_ATTRIBUTE, ()))
    return OmegaConf.to_yaml(OmegaConf.create(redact_mapping(tree)))
