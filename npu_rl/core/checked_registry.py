"""A registry that also checks each entry's signature, so a user's plug-in fails at start-up, not mid-training.

The core's extension points (advantage estimators, policy losses, KL estimators) each have exactly one call
signature. :class:`CheckedRegistry` adds to :class:`npu_rl.utils.registry.Registry` a check that the object a name
resolves to (a built-in or a plug-in loaded from ``pkg.mod:fn`` / ``path/file.py:fn``) can be called that way.
The error names the function, where it was defined, its actual signature and the one expected.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from npu_rl.utils.imports import looks_like_spec
from npu_rl.utils.registry import Registry


def describe_callable(obj: Any) -> str:
    """``module.qualname(signature)`` for error messages."""
    module = getattr(obj, "__module__", None) or "?"
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__name__
    try:
        signature = str(inspect.signature(obj))
    except (TypeError, ValueError):
        signature = "(...)"
    return f"{module}.{name}{signature}"


class CheckedRegistry(Registry):
    """A :class:`Registry` whose entries must accept ``probe_args`` / ``probe_kwargs`` (checked by binding).

    ``expected`` is the signature as shown to users, e.g. ``"fn(inputs: AdvantageInputs) -> AdvantageOutput"``.
    """

    def __init__(
        self,
        kind: str,
        config_key: str | None,
        *,
        expected: str,
        probe_args: tuple = (),
        probe_kwargs: dict | None = None,
    ):
        super().__init__(kind, config_key)
        self.expected = expected
        self._probe_args = probe_args
        self._probe_kwargs = dict(probe_kwargs or {})
        self._checked: set[int] = set()

    def check_signature(self, name: str, obj: Any) -> None:
        """Raise TypeError naming ``obj`` unless it can be called with the registry's one signature."""
        if id(obj) in self._checked:
            return
        if not callable(obj):
            raise TypeError(
                f"{self.kind} {name!r} resolves to {obj!r}, which is not callable; expected {self.expected}"
            )
        try:
            signature = inspect.signature(obj)
        except (TypeError, ValueError):
            self._checked.add(id(obj))  # builtins without a signature: trust them
            return
        try:
            signature.bind(*self._probe_args, **self._probe_kwargs)
        except TypeError as exc:
            raise TypeError(
                f"{self.kind} {name!r} resolves to {describe_callable(obj)}, which cannot be called as "
                f"{self.expected} ({exc}). Every {self.kind} of this registry takes exactly that signature."
            ) from None
        self._checked.add(id(obj))

    def register(self, *names: str) -> Callable[[Any], Any]:
        inner = super().register(*names)

        def decorator(obj: Any) -> Any:
            self.check_signature(names[0] if names else "?", obj)
            return inner(obj)

        return decorator

    def get(self, name: str, implementation: str | None = None) -> Any:
        obj = super().get(name, implementation)
        try:
            self.check_signature(name, obj)
        except TypeError:
            if looks_like_spec(name) and self._entries.get(name) is obj:
                del self._entries[name]  # do not keep a broken plug-in cached under its path
            raise
        return obj
