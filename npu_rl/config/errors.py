"""The error every config problem is reported with (its own module, so the loader and the checks share it without
importing each other)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user's config is wrong; the message lists every problem found and what to change."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid config ({len(self.problems)} problem{'s' if len(self.problems) > 1 else ''}):\n{lines}")
