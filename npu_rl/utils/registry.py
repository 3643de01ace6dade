"""A name -> object registry, one per extension point (advantage estimators, policy losses, reward managers ...).

Every entry of one registry has the same signature, so call sites never branch on the name. An unknown name fails
listing the known ones; a name that is a plug-in path (``pkg.mod:fn`` or ``path/to/file.py:fn``) is loaded and
registered on first use.
"""

from __future__ import annotations

import difflib
from typing import Callable, Generic, TypeVar

from npu_rl.utils.imports import load_object, looks_like_spec

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, config_key: str | None = None):
        self.kind = kind  # e.g. "advantage estimator"
        self.config_key = config_key  # e.g. "algorithm.adv_estimator", named in errors
        self._entries: dict[str, T] = {}
        self._implementations: dict[tuple[str, str], T] = {}

    def register(self, *names: str) -> Callable[[T], T]:
        """Decorator: ``@ADV_ESTIMATORS.register("grpo")``; several names register aliases."""

        def decorator(obj: T) -> T:
            for name in names:
                if name in self._entries and self._entries[name] is not obj:
                    raise ValueError(f"{self.kind} {name!r} is already registered")
                self._entries[name] = obj
            return obj

        return decorator

    def register_implementation(self, name: str, implementation: str) -> Callable[[T], T]:
        """Decorator: another implementation of the entry ``name`` (a fused kernel, say), with the same signature and
        the same results; ``get(name, implementation=...)`` picks it, and falls back to the plain entry where ``name``
        has no such implementation. The registry stays the only door: callers never branch on the name."""

        def decorator(obj: T) -> T:
            self._implementations[(name, implementation)] = obj
            return obj

        return decorator

    def implementations(self, name: str) -> list[str]:
        return sorted(impl for entry, impl in self._implementations if entry == name)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def get(self, name: str, implementation: str | None = None) -> T:
        if implementation is not None and (name, implementation) in self._implementations:
            return self._implementations[(name, implementation)]
        if name in self._entries:
            return self._entries[name]
        if looks_like_spec(name):
            obj = load_object(name)
            self._entries[name] = obj
            return obj
        where = f" (config key {self.config_key})" if self.config_key else ""
        close = difflib.get_close_matches(name, self._entries, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"unknown {self.kind} {name!r}{where}.{hint} Known: {', '.join(self.names())}; or give a plug-in path "
            "'package.module:function' / 'path/to/file.py:function'."
        )

    def check(self, name: str) -> None:
        """Fail now (at config validation) if ``name`` would fail later; plug-in paths are loaded to check them."""
        self.get(name)
