"""What each of a verl run script's overrides becomes in npu-rl, and the equivalent npu-rl command.

One row per override: ``supported`` (our key, same meaning), ``mapped`` (verl's name for one of our keys: the new
name), ``no effect`` (accepted and dropped: why), ``refused`` (a feature or value npu-rl lacks: why, and what to use
instead), ``unknown`` (not a key of verl's tree either: the closest key). Settings that behave differently on Ascend
NPUs are flagged (``ascend``). Hydra's own flags (``--config-name``, ``--config-path``, ``-cn``, ``-cp``) are read
as flags. The command keeps supported and mapped overrides, leaves dropped ones out and comments refused ones out.
The value checks (the loader's own) are run by the ``npu-rl migrate`` command (:mod:`npu_rl.commands.migrate`).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from npu_rl.compat.verl.keys import ascend_notes, classify, is_off, refused_value
from npu_rl.compat.verl.script import ENTRY_POINTS
from npu_rl.config.loader import suggest_key
from npu_rl.utils.redact import is_secret_name, redact_text

KIND_LABELS = {"implemented": "supported", "alias": "mapped", "no_effect": "no effect", "refused": "refused",
               "unknown": "unknown", "off": "no effect", "flag": "flag"}
FAILING = ("refused", "unknown")
HYDRA_FLAGS = {"--config-name": "config_name", "-cn": "config_name", "--config-path": "config_path",
               "-cp": "config_path", "--config-dir": "config_path", "-cd": "config_path"}
# verl's recipe.dapo.main_dapo is main_ppo with recipe/dapo/config/dapo_trainer.yaml: these defaults on top
DAPO_ENTRY_DEFAULTS = ("reward_model.reward_manager=dapo", "trainer.project_name=verl-dapo")


@dataclass
class Row:
    override: str
    key: str
    kind: str  # implemented | alias | no_effect | refused | unknown | off | flag
    detail: str = ""
    rewritten: str | None = None  # the override for the npu-rl command; None: left out
    ascend: str = ""


@dataclass
class Flags:
    """Hydra's command-line flags of the trainer call."""

    config_name: str = "ppo_trainer"
    config_path: str | None = None


def _split(override: str) -> tuple[str, str, str | None]:
    """(prefix '+', '++' or '~', key, value text or None)."""
    body = override.lstrip("+~")
    prefix = override[: len(override) - len(body)]
    key, sep, value = body.partition("=")
    return prefix, key, (value if sep else None)


def _parse_value(text: str | None):
    if text is None:
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides([f"k={text}"])[0].value()
    except Exception:  # noqa: BLE001 - not a Hydra value: keep the text (the loader reports it)
        return text


def split_flags(words: list[str]) -> tuple[list[str], Flags, list[Row]]:
    """The overrides, Hydra's flags (``--config-name=x``, ``--config-name x``, ``-cn x`` ...) and a row for each
    flag (``--cfg``/``--help`` and other flags of Hydra's are refused: they are not training settings)."""
    overrides, flags, rows, i = [], Flags(), [], 0
    while i < len(words):
        word = words[i]
        name, eq, value = word.partition("=")
        if name in HYDRA_FLAGS:
            if not eq:
                value = words[i + 1] if i + 1 < len(words) else ""
                i += 1
            text = f"{name}={value}"
            if HYDRA_FLAGS[name] == "config_name":
                flags.config_name = value[:-5] if value.endswith(".yaml") else value
                rows.append(Row(text, name, "flag", f"-> --config-name {flags.config_name}"))
            elif value.rstrip("/") in ("config", "./config"):  # verl's module-relative folder: ours ship inside
                rows.append(Row(text, name, "flag", "left out: verl's own config folder; npu-rl's configs ship "
                                                    "inside the package"))
            else:
                flags.config_path = value
                rows.append(Row(text, name, "flag", "-> --config-path (a folder of npu-rl YAML; verl's own YAML "
                                                    "files are not read)"))
        elif word.startswith("-"):
            rows.append(Row(word, word, "refused", "a flag of Hydra's that is not a setting; instead: leave it out "
                                                   "(npu-rl's --cfg job prints and checks the config)"))
        else:
            overrides.append(word)
        i += 1
    return overrides, flags, rows


# verl's asynchronous trainers: npu-rl's module of the same name, its config and the mode it adds (docs/async.md)
ASYNC_TRAINERS = {
    "fully_async_policy.fully_async_main": ("fully_async_ppo_trainer", "fully_async"),
    "one_step_off_policy.main_ppo": ("one_step_off_ppo_trainer", "one_step_off"),
}


# verl-recipe's PRIME trainer: npu-rl's module and its config (docs/algorithms.md, "PRIME")
PRIME_TRAINER = ("recipe.prime.main_prime", "npu_rl.trainer.main_prime", "prime_trainer")


def npu_rl_module(entry_point: str | None) -> tuple[str, str | None]:
    """(npu-rl's module for verl's ``entry_point``, the ``async_training.mode`` it sets or None)."""
    for tail, (_, mode) in ASYNC_TRAINERS.items():
        if entry_point is not None and entry_point.endswith("experimental." + tail):
            return f"npu_rl.experimental.{tail}", mode
    if entry_point is not None and entry_point.endswith("main_prime"):
        return PRIME_TRAINER[1], None
    return "npu_rl.trainer.main_ppo", None


def entry_config_name(entry_point: str | None, config_name: str) -> str:
    """The config npu-rl's module for ``entry_point`` starts from when the script names none (PRIME's own)."""
    if entry_point is not None and entry_point.endswith("main_prime") and config_name == "ppo_trainer":
        return PRIME_TRAINER[2]
    return config_name


def entry_point_rows(module: str) -> list[Row]:
    """A refused row for a recipe's own trainer (none for main_ppo, its DAPO entry point and the async trainers)."""
    if module in ENTRY_POINTS:
        return []
    return [Row(f"-m {module}", module, "refused", f"{module} is a recipe's own trainer (its own loop and config), "
                                                   "not main_ppo; instead: python3 -m npu_rl.trainer.main_ppo with "
                                                   "the overrides below")]


def classify_override(override: str) -> Row:
    prefix, key, value_text = _split(override)
    if key in ("preset", "hydra") or key.startswith("hydra."):
        return Row(override, key, "implemented", rewritten=override)
    status = classify(key)
    ascend = next((note for k, note in ascend_notes().items() if key == k or key.startswith(k + ".")), "")
    row = Row(override, key, status.kind, ascend=ascend)
    if status.kind in ("implemented", "alias"):
        target = status.target if status.kind == "alias" else key
        value = _parse_value(value_text)
        refusal = refused_value(target, value) if value_text is not None else None
        if refusal is not None:
            row.kind, row.detail = "refused", f"{refusal.why}; instead: {refusal.instead}"
            return row
        # no '+' needed: the key exists, or lies in a free-form dict
        written = target + (f"={value_text}" if value_text is not None else "")
        row.rewritten = override if prefix.startswith("~") and status.kind == "implemented" else written
        row.detail = f"-> {status.target}" if status.kind == "alias" else ""
    elif status.kind == "no_effect":
        row.detail = status.why
    elif status.kind == "refused":
        if is_off(key, _parse_value(value_text)):
            row.kind = "off"
            row.detail = f"accepted, the feature stays off ({status.why})"
        else:
            row.detail = f"{status.why}; instead: {status.instead}"
    else:
        hint = suggest_key(key)
        row.detail = "not a key of verl's tree or npu-rl's" + (f"; did you mean {hint!r}?" if hint else "")
    return row


def dapo_entry_defaults(overrides: list[str]) -> tuple[list[str], str]:
    """The overrides with verl's DAPO entry point's own defaults put first (where the script does not set them)."""
    keys = {_split(o)[1] for o in overrides}
    added = [d for d in DAPO_ENTRY_DEFAULTS if d.split("=", 1)[0] not in keys]
    note = ("the script runs recipe.dapo.main_dapo, which is main_ppo plus the DAPO recipe's defaults; added: "
            + (", ".join(added) if added else "nothing (the script sets them)"))
    return added + list(overrides), note


def migrate(overrides: list[str]) -> list[Row]:
    return [classify_override(o) for o in overrides]


def kept_overrides(rows: list[Row]) -> list[str]:
    return [row.rewritten for row in rows if row.rewritten is not None]


def quote(word: str) -> str:
    """Shell quoting for the printed command; a secret kept as ``$NAME`` stays expandable (double quotes)."""
    if not any(is_secret_name(m.group(1)) for m in re.finditer(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", word)):
        return shlex.quote(word)
    return '"' + re.sub(r'(["`\\])', r"\\\1", word) + '"'


_REFERENCE = re.compile(r"=\$\{?[A-Za-z_][A-Za-z0-9_]*\}?$")


def mask(text: str) -> str:
    """``text`` as it may be printed: secrets masked (npu_rl.utils.redact), except a value that only names a
    variable (``WANDB_API_KEY=$WANDB_API_KEY``), which the shell expands when the command runs."""
    return text if _REFERENCE.search(text) else redact_text(text)


def command(rows: list[Row], flags: Flags, entry_point: str | None = None, cfg_job: bool = False) -> list[str]:
    """The equivalent npu-rl command (lines joined by ``\\``), refused and unknown overrides commented out."""
    head = f"python3 -m {npu_rl_module(entry_point)[0]} --config-name {shlex.quote(flags.config_name)}"
    if flags.config_path:
        head += f" --config-path {shlex.quote(flags.config_path)}"
    if cfg_job:
        head += " --cfg job"
    lines = [head] + [f"    {quote(mask(o))}" for o in kept_overrides(rows)]
    lines = [line + " \\" for line in lines[:-1]] + lines[-1:]
    lines += [f"#   {mask(row.override)}    # {KIND_LABELS[row.kind]}: {row.detail}" for row in rows
              if row.kind in FAILING]
    return lines


def render(rows: list[Row], source: str, warnings: list[str]) -> list[str]:
    """The per-override table (one line each, an ``ascend:`` line under the settings that differ on NPUs)."""
    lines = [f"# npu-rl migrate: {source} ({len(rows)} overrides)"]
    lines += [f"# warning: {redact_text(w)}" for w in warnings]
    width = min(max((len(r.override) for r in rows), default=0), 72)
    counts: dict[str, int] = {}
    for row in rows:
        label = KIND_LABELS[row.kind]
        counts[label] = counts.get(label, 0) + 1
        detail = f"  {row.detail}" if row.detail else ""
        lines.append(f"{label:<10} {mask(row.override):<{width}}{detail}".rstrip())
        if row.ascend:
            lines.append(f"{'':<10} ascend: {row.ascend}")
    lines.append("# " + ", ".join(f"{n} {label}" for label, n in counts.items()))
    return lines
