"""Load a user's object from a dotted path (``pkg.mod:name``, ``pkg.mod.name``) or a file (``path/to/file.py:name``).

Loading by file path inside the process that calls the object means nothing has to be pickled: a reward function
defined in a user's script works the same in-process and inside a Ray worker (verl #3150 hit pickling errors).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from typing import Any


def load_module_from_file(path: str) -> Any:
    """Import a Python file as a module (cached by absolute path)."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"cannot load {path}: no such file")
    module_name = "npu_rl_user_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise ImportError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    return module


def verl_import_hint(exc: BaseException) -> str:
    """A sentence for an import that failed because a user's file imports verl (verl-recipe's reward functions,
    tools and dataset classes do) and verl is not installed; "" otherwise."""
    while exc is not None:
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "verl":
            return ("; the file imports verl, which is not installed: npu-rl does not need verl and does not provide "
                    "its modules. Install verl beside npu-rl for the helpers the file uses, or replace them (verl's "
                    "rule scorers gsm8k / math / math_dapo are npu_rl.reward.scorers)")
        exc = exc.__cause__ or exc.__context__
    return ""


def split_spec(spec: str) -> tuple[str, str]:
    """``a.b:c`` / ``f.py:c`` -> (``a.b`` / ``f.py``, ``c``); ``a.b.c`` -> (``a.b``, ``c``)."""
    if ":" in spec:
        source, _, name = spec.rpartition(":")
    else:
        source, _, name = spec.rpartition(".")
    if not source or not name:
        raise ValueError(f"{spec!r} is not a plug-in path; expected 'package.module:name' or 'path/to/file.py:name'")
    return source, name


def looks_like_spec(name: str) -> bool:
    """Whether a registry name is really a plug-in path."""
    return ":" in name or name.endswith(".py") or ("." in name and "/" not in name and not name[0].isdigit())


def load_object(spec: str) -> Any:
    """Resolve ``spec`` to the object it names; errors name the spec and what was missing."""
    source, name = split_spec(spec)
    if source.endswith(".py") or os.sep in source:
        module = load_module_from_file(source)
    else:
        try:
            module = importlib.import_module(source)
        except ImportError as exc:
            raise ImportError(f"cannot import module {source!r} (from {spec!r}): {exc}") from exc
    if not hasattr(module, name):
        public = sorted(n for n in vars(module) if not n.startswith("_"))
        raise AttributeError(f"{source!r} has no attribute {name!r} (from {spec!r}); it defines: {', '.join(public)}")
    return getattr(module, name)
