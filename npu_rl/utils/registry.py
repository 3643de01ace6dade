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

    def register(self, *names: str) -> Callable[[T], T]:
        """Decorator: ``@ADV_ESTIMATORS.register("grpo")``; several names register aliases."""

        def decorator(obj: T) -> T:
            for name in names:
                if name in self._entries and self._entries[name] is not obj:
                    raise ValueError(f"{self.kind} {name!r} is already registered")
                self._entries[name] = obj
            return obj

        return decorator

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def get(self, name: str) -> T:
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
