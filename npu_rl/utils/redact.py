"""One rule for secrets in everything npu-rl writes or prints: run records (``command.json``, ``command.sh``),
``config.yaml``, ``curves.html``, the printed resume command, logs, the config handed to trackers, migrate's output.

Masked (replaced by ``<redacted>``):

- credentials in a URL: ``https://user:pass@host`` -> ``https://<redacted>@host`` (the user part too: a token is
  often given as the user, ``https://<token>@host``);
- a value the config took from the environment (``${oc.env:NAME}``, whatever NAME and whatever key it fills: the
  value was in the environment, not in the config), by its place in the config tree (``mask_env_values``);
- the value of a key whose name looks like a secret: ``*_API_KEY``, ``*_TOKEN``, ``*SECRET*``, ``*PASSWORD*`` /
  ``*PASSWD*``, ``*ACCESS_KEY``, ``*PRIVATE_KEY`` (case ignored; for a dotted key, its last part; a tokenizer's
  ``pad_token`` / ``eos_token`` ... is not a secret), wherever it
  appears: an environment variable, an ``env_vars`` entry of ``ray_kwargs.ray_init.runtime_env``, a mapping key in a
  config tree, ``NAME=value`` / ``NAME: value`` in a line of text or an override on a command line.

Only what is written or printed is masked: the run itself still receives the real values (the config object, the
environment and Ray's ``runtime_env`` are never changed).
"""

from __future__ import annotations

import logging
import re
from typing import Any, Mapping

MASK = "<redacted>"

_SECRET_NAME = re.compile(r"(?:^|_)(?:API_?KEY|TOKEN|ACCESS_?KEY|PRIVATE_?KEY)$|SECRET|PASSWORD|PASSWD", re.I)
_TOKENIZER_WORD = re.compile(r"^(?:PAD|EOS|BOS|UNK|SEP|CLS|MASK|STOP|END|IMAGE|VIDEO)_TOKEN$", re.I)  # not secrets
# scheme://userinfo@ : userinfo is everything up to the first '@' before the host (no '/', no whitespace)
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s@'\"]+)@")
# NAME= / NAME: / "NAME": / 'NAME' = ; the value is read by hand after it
_KEY_SEPARATOR = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<close>[\"']?)(?P<sep>[ \t]*[=:][ \t]*)")
_VALUE_END = set(" \t\r\n,;}])")


def is_secret_name(name: Any) -> bool:
    """Whether a key or variable named ``name`` (its last dotted part) holds a secret."""
    if not isinstance(name, str) or not name:
        return False
    last = name.rsplit(".", 1)[-1]
    return bool(_SECRET_NAME.search(last)) and not _TOKENIZER_WORD.match(last)


def redact_url(text: str) -> str:
    return _URL_USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)


def _value_span(text: str, start: int) -> int:
    """Where the value that starts at ``start`` ends: a quoted string to its closing quote, else the next space or
    delimiter."""
    if start < len(text) and text[start] in "\"'":
        quote = text[start]
        end = text.find(quote, start + 1)
        return len(text) if end < 0 else end + 1
    end = start
    while end < len(text) and text[end] not in _VALUE_END and text[end] not in "\"'":
        end += 1
    return end


def redact_text(text: Any) -> Any:
    """``text`` with URL credentials and the values of secret-named keys masked (anything not a string is returned
    as it is)."""
    if not isinstance(text, str) or not text:
        return text
    text = redact_url(text)
    out, position = [], 0
    for match in _KEY_SEPARATOR.finditer(text):
        if match.start() < position or not is_secret_name(match["name"]):
            continue
        if match["sep"].strip() == ":" and text.startswith("//", match.end()):
            continue  # a URL's scheme, not a key
        value_start = match.end()
        value_end = _value_span(text, value_start)
        if value_end == value_start or text[value_start:value_end].strip("\"'") in ("", MASK):
            continue
        quote = text[value_start] if text[value_start] in "\"'" else ""
        out.append(text[position:value_start])
        out.append(f"{quote}{MASK}{quote}" if quote and value_end - value_start > 1 else MASK)
        position = value_end
    out.append(text[position:])
    return "".join(out)


def redact_mapping(tree: Any) -> Any:
    """A copy of a config tree (dicts, lists, scalars) with secret-named keys' values and URL credentials masked."""
    if isinstance(tree, Mapping):
        out = {}
        for key, value in tree.items():
            if is_secret_name(key) and value is not None and not isinstance(value, (Mapping, list, tuple)):
                out[key] = MASK
            else:
                out[key] = redact_mapping(value)
        return out
    if isinstance(tree, (list, tuple)):
        return type(tree)(redact_mapping(v) for v in tree)
    return redact_text(tree) if isinstance(tree, str) else tree


_ENV_INTERPOLATION = re.compile(r"\$\{\s*oc\.env\s*:")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")  # ${trainer.experiment_name}
ENV_KEYS_ATTRIBUTE = "_npu_rl_env_keys"  # set on a loaded config object: the places filled from the environment


def _strings(raw: Any, prefix: tuple = ()) -> list[tuple[tuple, str]]:
    if isinstance(raw, Mapping):
        return [item for key, value in raw.items() for item in _strings(value, prefix + (key,))]
    if isinstance(raw, (list, tuple)):
        return [item for i, value in enumerate(raw) for item in _strings(value, prefix + (i,))]
    return [(prefix, raw)] if isinstance(raw, str) else []


def env_interpolated_keys(raw: Any) -> list[tuple]:
    """The places (key / index paths) in an unresolved config tree whose value comes from the environment: written
    ``${oc.env:...}`` (or containing it), or interpolating such a place (``default_local_dir`` built from
    ``${trainer.experiment_name}``), to any depth."""
    strings = _strings(raw)
    marked = {path for path, text in strings if _ENV_INTERPOLATION.search(text)}
    while True:
        dotted = {".".join(map(str, path)) for path in marked}
        more = {path for path, text in strings if path not in marked
                and any(ref.strip() in dotted for ref in _REFERENCE.findall(text))}
        if not more:
            return sorted(marked, key=str)
        marked |= more


def mark_env_keys(config: Any, keys: list[tuple]) -> Any:
    """Remember on a loaded config object which of its places came from the environment (``mask_env_values``)."""
    object.__setattr__(config, ENV_KEYS_ATTRIBUTE, tuple(keys))
    return config


def mask_env_values(tree: Any, keys: Any) -> Any:
    """A copy of a config tree (dicts and lists) with the value at each place of ``keys`` masked."""
    marked = {tuple(k) for k in keys}

    def walk(node: Any, path: tuple) -> Any:
        if path in marked and node is not None:
            return MASK
        if isinstance(node, Mapping):
            return {k: walk(v, path + (k,)) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return type(node)(walk(v, path + (i,)) for i, v in enumerate(node))
        return node

    return walk(tree, ())


def redact_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """Environment variables as they may be recorded: secret-named ones masked, URL credentials masked."""
    return {key: MASK if is_secret_name(key) else redact_text(value) for key, value in environ.items()}


def redact_argv(argv: list[str]) -> list[str]:
    """A command line as it may be recorded or printed (each argument masked on its own, so quoting still holds)."""
    return [redact_text(str(a)) for a in argv]


class RedactingFilter(logging.Filter):
    """A logging filter that masks secrets in a record's message (its arguments formatted first)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact_text(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


_installed = False


def install_log_redaction() -> None:
    """Mask secrets in every log record of this process, whichever logger or handler writes it (a library's own
    handler added later included): the record factory masks the formatted message when a record is made."""
    global _installed
    if _installed:
        return
    make = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is the logging module's to report
            return record
        masked = redact_text(message)
        if masked != message:
            record.msg, record.args = masked, None
        return record

    logging.setLogRecordFactory(factory)
    _installed = True
