"""verl's overrides rewritten into npu-rl's, before the config loads (the entry points call this once).

For each ``key=value`` (with ``+``, ``++`` or ``~`` in front, as Hydra takes them): a key the schema has passes
unchanged; verl's name for one of our keys is rewritten to ours (a note says so); a key without effect here is
dropped with a note saying why; a refused key fails with the reason and what to use instead, unless its value
leaves the feature off (then it is dropped with a note); a value verl has and npu-rl does not (``rollout.name=
sglang``) fails the same way. Keys neither side knows pass through, so that the loader
names them with the closest valid key.
"""

from __future__ import annotations

from npu_rl.compat.verl.keys import classify, is_off, refused_value
from npu_rl.config.errors import ConfigError

PASS_THROUGH = ("preset", "hydra")  # our config groups and Hydra's own keys


def _parse(text: str):
    """Hydra's reading of one override, or None where it does not parse (the loader reports that)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides([text])[0]
    except Exception:  # noqa: BLE001 - Hydra's grammar errors have no common base; the loader explains them
        return None


def translate_overrides(overrides: list[str], notes: list[str] | None = None) -> list[str]:
    """The overrides with verl's keys turned into ours (see the module docstring); raises ConfigError listing
    every refused override."""
    out, problems = [], []
    for text in overrides:
        override = _parse(text)
        key = override.key_or_group if override is not None else ""
        if override is None or key.split(".")[0] in PASS_THROUGH:
            out.append(text)
            continue
        status = classify(key)
        value_text = text.split("=", 1)[1] if "=" in text else ""
        target = status.target if status.kind == "alias" else key
        refusal = refused_value(target, override.value()) if "=" in text and not override.is_delete() else None
        if refusal is not None:
            problems.append(f"{key}={value_text}: {refusal.why}; instead: {refusal.instead}")
            continue
        if status.kind in ("implemented", "unknown"):
            out.append(text)
            continue
        prefix = text[: len(text) - len(text.lstrip("+~"))]
        if status.kind == "alias":
            if notes is not None:
                notes.append(f"{key} is verl's name for {status.target}")
            out.append(f"{prefix}{status.target}={value_text}" if "=" in text else f"{prefix}{status.target}")
        elif override.is_delete():
            continue
        elif status.kind == "no_effect":
            if notes is not None:
                notes.append(f"{key}={value_text} has no effect in npu-rl: {status.why}")
        elif is_off(key, override.value()):
            if notes is not None:
                notes.append(f"{key}={value_text} accepted (the feature stays off): {status.why}")
        else:
            problems.append(f"{key}={value_text}: {status.why}; instead: {status.instead}")
    if problems:
        raise ConfigError(problems)
    return out
