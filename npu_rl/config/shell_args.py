"""Read the overrides a verl run script passes to ``main_ppo``, WITHOUT running it (a script is someone else's code).

A small static reading of the bash that run scripts use: variable assignments (``x=${X:-default}``, ``$((a * b))``,
``export``), arrays (``A=( ... )``, ``A+=( ... )``, ``"${A[@]}"``), ``case`` and ``if [ ... ]`` on known values,
line continuations and quoting. Whatever it cannot evaluate it keeps as written and reports in ``warnings``:
command substitutions (``$(date ...)``), tests it cannot decide (that branch is skipped), unknown variables (kept as
``${NAME}``). Give values with ``env`` (``--env DEVICE=npu``) to pick a script's branch.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

ENTRY_POINTS = ("verl.trainer.main_ppo", "recipe.dapo.main_dapo", "npu_rl.trainer.main_ppo", "main_ppo", "main_dapo",
                # the asynchronous trainers (docs/async.md)
                "verl.experimental.one_step_off_policy.main_ppo", "verl.experimental.fully_async_policy.fully_async_main",
                "npu_rl.experimental.one_step_off_policy.main_ppo",
                "npu_rl.experimental.fully_async_policy.fully_async_main")
_ASSIGN = re.compile(r"^(?:export\s+|local\s+|readonly\s+|declare\s+(?:-\w+\s+)?)?([A-Za-z_]\w*)(\+?)=(.*)$")
_QUOTED_ARRAY = re.compile(r'"\$(?:\{([A-Za-z_]\w*)\[[@*]\]\}|\{?[@*]\}?)"(?=\s|$)')
_NBSP = "\x00"  # stands for a space inside an unevaluated $(...), so that it is not split
_STOP_WORDS = {"2>&1", "|", "||", "&&", ";", ">", ">>", "&", "2>", "|&"}


@dataclass
class ScriptReading:
    overrides: list[str] = field(default_factory=list)
    entry_point: str | None = None
    warnings: list[str] = field(default_factory=list)


class _Shell:
    def __init__(self, env: dict[str, str]):
        self.vars: dict[str, str] = dict(env)
        self.arrays: dict[str, list[str]] = {}
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    # ------------------------------------------------------------------------------------------ expansion
    def _param(self, body: str) -> list[str] | str:
        """``${...}`` body -> a string, or a list of words for ``NAME[@]``."""
        m = re.fullmatch(r"([A-Za-z_]\w*)\[[@*]\]", body)
        if m:
            return list(self.arrays.get(m.group(1), []))
        m = re.fullmatch(r"([A-Za-z_]\w*|[0-9]+)(:?[-=+?])(.*)", body, flags=re.DOTALL)
        if m:
            name, op, word = m.groups()
            value = self.vars.get(name)
            unset = value is None or (op.startswith(":") and value == "")
            if op.endswith("?"):
                if unset:
                    self.warn(f"{name} must be set (the script says: {word.strip() or 'required'}); kept as "
                              f"${{{name}}} (give it with --env {name}=...)")
                    return "${" + name + "}"
                return value
            if op.endswith("+"):
                return "" if unset else self.expand_word(word)
            if unset:
                default = self.expand_word(word)
                if op.endswith("="):
                    self.vars[name] = default
                return default
            return value
        if re.fullmatch(r"[A-Za-z_]\w*|[@*#?0-9]", body):
            if body in ("@", "*"):
                return []
            if body in self.vars:
                return self.vars[body]
            if body in self.arrays:
                return self.arrays[body][0] if self.arrays[body] else ""
            self.warn(f"${{{body}}} is not set in the script: kept as written (give it with --env {body}=...)")
            return "${" + body + "}"
        self.warn(f"${{{body}}}: this expansion is not evaluated; kept as written")
        return "${" + body + "}"

    def _arith(self, expression: str) -> str:
        text = re.sub(r"\$?\{?([A-Za-z_]\w*)\}?", lambda m: self.vars.get(m.group(1), "x"), expression)
        if re.fullmatch(r"[\d\s+\-*/%()]+", text):
            try:
                return str(int(eval(text.replace("/", "//"), {"__builtins__": {}}, {})))  # digits and operators only
            except (SyntaxError, ZeroDivisionError):
                pass
        self.warn(f"$(({expression})) could not be computed; kept as written")
        return f"$(({expression}))"

    def _skip_dollar(self, text: str, i: int) -> tuple[None, int]:
        """The index after the ``$`` expression at ``text[i]``, without evaluating it."""
        pairs = {"$((": ("(", ")"), "$(": ("(", ")"), "${": ("{", "}")}
        for start, (open_, close) in pairs.items():
            if text.startswith(start, i):
                depth, j = 0, i + 1
                while j < len(text):
                    depth += 1 if text[j] == open_ else -1 if text[j] == close else 0
                    j += 1
                    if depth == 0:
                        break
                return None, j
        m = re.compile(r"[A-Za-z_]\w*|[@*#?0-9]").match(text, i + 1)
        return None, (m.end() if m else i + 1)

    def _dollar(self, text: str, i: int) -> tuple[list[str] | str, int]:
        """Expand the ``$`` at ``text[i]``; returns (value, index after it)."""
        if text.startswith("$((", i):
            depth, j = 0, i + 1
            while j < len(text):
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
                if depth == 0:
                    break
            return self._arith(text[i + 3: j - 2]), j
        if text.startswith("$(", i):
            depth, j = 0, i + 1
            while j < len(text):
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
                if depth == 0:
                    break
            self.warn(f"{text[i:j]}: command substitutions are not run; kept as written")
            return re.sub(r"\s", _NBSP, text[i:j]), j
        if text.startswith("${", i):
            depth, j = 0, i + 1
            while j < len(text):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
                if depth == 0:
                    break
            return self._param(text[i + 2: j - 1]), j
        m = re.compile(r"[A-Za-z_]\w*|[@*#?0-9]").match(text, i + 1)
        if m:
            return self._param(m.group(0)), m.end()
        return "$", i + 1

    def words(self, text: str, expand: bool = True, split: bool = True) -> list[str]:
        """Word-split and expand like bash (quotes removed; ``"${A[@]}"`` gives one word per element).

        ``expand=False`` only splits (``$...`` kept verbatim, quotes kept); ``split=False`` expands without
        splitting (an assignment's value)."""
        out: list[str] = []
        current: list[str] = []
        started = False
        quote = None
        i = 0
        while i < len(text):
            ch = text[i]
            if not split and ch.isspace() and quote is None:
                current.append(ch)
                i += 1
                continue
            if not expand:
                if quote is None and ch == "#" and not started and not current:
                    break  # a comment
                if ch == "$" and quote != "'":
                    start = i
                    _, i = self._skip_dollar(text, i)
                    current.append(text[start:i])
                    started = True
                    continue
                if ch in "'\"":
                    quote = None if quote == ch else (ch if quote is None else quote)
                if quote is None and ch.isspace():
                    if started or current:
                        out.append("".join(current))
                    current, started = [], False
                else:
                    current.append(ch)
                    started = True
                i += 1
                continue
            array = _QUOTED_ARRAY.match(text, i) if quote is None else None
            if array and not current and not started and split:
                name = array.group(1)
                out.extend(self.arrays.get(name, []) if name else [])  # "$@": the script's arguments (none)
                i = array.end()
                continue
            if quote == "'":
                if ch == "'":
                    quote = None
                else:
                    current.append(ch)
                i += 1
                continue
            if ch == "\\" and i + 1 < len(text):
                current.append(text[i + 1])
                started = True
                i += 2
                continue
            if ch in "'\"" and (quote is None or quote == ch):
                quote = None if quote == ch else ch
                started = True
                i += 1
                continue
            if ch == "$":
                value, i = self._dollar(text, i)
                if isinstance(value, list):  # array: splice its elements as separate words
                    if value:
                        current.append(value[0])
                        for element in value[1:]:
                            out.append("".join(current))
                            current = [element]
                        started = True
                    continue
                if quote is None and value and value.split() and re.search(r"\s", value):  # unquoted: split
                    parts = value.split()
                    current.append(parts[0])
                    for part in parts[1:]:
                        out.append("".join(current))
                        current = [part]
                else:
                    current.append(value)
                started = True
                continue
            if quote is None and ch.isspace():
                if started or current:
                    out.append("".join(current))
                current, started = [], False
                i += 1
                continue
            if quote is None and ch == "#" and not started and not current:
                break  # a comment
            current.append(ch)
            started = True
            i += 1
        if started or current:
            out.append("".join(current))
        return out

    def expand_word(self, text: str) -> str:
        return " ".join(self.words(text))

    # ---------------------------------------------------------------------------------------------- tests
    def test(self, condition: str) -> bool | None:
        """``[ a = b ]`` / ``[[ a == b ]]`` / ``-n`` / ``-z``, joined by && / || and grouped with { ...; };
        None when undecidable."""
        pieces = re.split(r"(\[\[.*?\]\]|\[\s.*?\s\]|&&|\|\||[{};])", condition.strip())
        expression = []
        for piece in (p.strip() for p in pieces):
            if not piece:
                continue
            if piece in ("&&", "||"):
                expression.append(" and " if piece == "&&" else " or ")
            elif piece in ("{", "}"):
                expression.append("(" if piece == "{" else ")")
            elif piece == ";":
                continue
            elif piece.startswith("["):
                value = self._single_test(piece)
                if value is None:
                    return None
                expression.append(str(value))
            else:
                return None
        try:
            return bool(eval("".join(expression), {"__builtins__": {}}, {}))  # only True/False/and/or/()
        except SyntaxError:
            return None

    def _single_test(self, text: str) -> bool | None:
        words = self.words(text.strip())
        if words and words[0] in ("[", "[[") and words[-1] in ("]", "]]"):
            words = words[1:-1]
        negate = bool(words) and words[0] == "!"
        words = words[1:] if negate else words
        value: bool | None = None
        if len(words) == 3 and words[1] in ("=", "==", "!="):
            if "$(" in words[0] or "$(" in words[2] or "${" in words[0] or "${" in words[2]:
                return None
            value = (words[0] == words[2]) if words[1] != "!=" else (words[0] != words[2])
        elif len(words) == 2 and words[0] in ("-n", "-z"):
            value = bool(words[1]) if words[0] == "-n" else not words[1]
        return None if value is None else (not value if negate else value)


def _open_double_quote(line: str) -> bool:
    """Whether ``line`` leaves a double-quoted string open (single-quoted text and comments aside)."""
    unquoted = re.sub(r"'[^'\"]*'", "", line)
    if unquoted.lstrip().startswith("#"):
        return False
    return len(re.findall(r'(?<!\\)"', unquoted)) % 2 == 1


def _join_open_quotes(lines: list[str]) -> list[str]:
    """Join the lines of a double-quoted string that spans several (``X="\n a=1\n b=2"``) into one."""
    out: list[str] = []
    pending: str | None = None
    for line in lines:
        if pending is not None:
            pending += " " + line.strip()
            if _open_double_quote(line):
                out.append(pending)
                pending = None
            continue
        if _open_double_quote(line):
            pending = line
        else:
            out.append(line)
    if pending is not None:
        out.append(pending)
    return out


def _closes_array(line: str) -> bool:
    """Whether ``line`` ends an array assignment: a ``)`` that no ``(`` on the line opened (quotes aside)."""
    unquoted = re.sub(r"'[^']*'|\"(?:[^\"\\]|\\.)*\"", "", line)
    return unquoted.count(")") > unquoted.count("(")


def read_script(text: str, env: dict[str, str] | None = None) -> ScriptReading:
    """The overrides of the script's ``main_ppo`` command (see the module docstring)."""
    shell = _Shell(env or {})
    lines = _join_open_quotes(text.replace("\\\r\n", " ").replace("\\\n", " ").splitlines())
    reading = ScriptReading()
    active: list[bool] = []  # one flag per open if / case block: whether the current branch runs
    taken: list[bool] = []  # whether a branch of that block has been taken
    case_word: list[str] = []
    pending_array: tuple[str, bool, list[str]] | None = None
    for raw in lines:
        line = raw.strip()
        if pending_array is not None:
            name, append, parts = pending_array
            if _closes_array(line):
                parts.append(line[: line.rfind(")")])
                if all(active):  # line by line: a comment ends at its line
                    words = [word for part in parts for word in shell.words(part)]
                    shell.arrays[name] = (shell.arrays.get(name, []) if append else []) + words
                pending_array = None
            else:
                parts.append(line)
            continue
        if not line or line.startswith("#"):
            continue
        head = line.split()[0]
        if head == "if" and re.search(r"\bfi\s*;?\s*$", line):
            shell.warn(f"one-line `if` not evaluated: `{line}`")
            continue
        if head == "if" or head == "elif":
            condition = re.sub(r";?\s*then\s*$", "", line[len(head):]).strip()
            if head == "if":
                active.append(False)
                taken.append(False)
            decided = shell.test(condition) if all(active[:-1]) else False
            if decided is None:
                shell.warn(f"cannot decide `{line}`: that branch is skipped")
                decided = False
            active[-1] = bool(decided) and not taken[-1]
            taken[-1] = taken[-1] or active[-1]
            continue
        if head == "else" and active:
            active[-1] = not taken[-1]
            taken[-1] = True
            continue
        if head in ("fi", "esac") and active:
            active.pop()
            taken.pop()
            if head == "esac" and case_word:
                case_word.pop()
            continue
        if head == "case":
            case_word.append(shell.expand_word(line[len("case"):].rsplit(" in", 1)[0]))
            active.append(False)
            taken.append(False)
            continue
        if case_word and len(active) and re.match(r"^[^=()]*\)\s*", line) and not _ASSIGN.match(line):
            patterns, _, rest = line.partition(")")
            alternatives = [shell.expand_word(p.strip()) for p in patterns.lstrip("(").split("|")]
            hit = any(fnmatch.fnmatchcase(case_word[-1], p) for p in alternatives)
            active[-1] = hit and not taken[-1]
            taken[-1] = taken[-1] or active[-1]
            line = rest.strip()
            if not line:
                continue
        if line == ";;" or line.endswith(";;") and not line[:-2].strip():
            continue
        if line.endswith(";;"):
            line = line[:-2].strip()
        match = _ASSIGN.match(line)
        if match and match.group(3).startswith("("):  # an array, read even in a skipped branch (to find its end)
            name, append, value = match.groups()
            body = value[1:]
            if not body.rstrip().endswith(")"):
                pending_array = (name, bool(append), [body])
            elif all(active):
                words = shell.words(body.rstrip()[:-1])
                shell.arrays[name] = (shell.arrays.get(name, []) if append else []) + words
            continue
        if not all(active):
            continue
        raw = shell.words(line, expand=False)
        if match and len(raw) == 1:  # NAME=value (with `VAR=x cmd ...` the words go on to the command)
            name, append, _ = match.groups()
            value = "".join(shell.words(raw[0].split("=", 1)[1], split=False))
            shell.vars[name] = (shell.vars.get(name, "") if append else "") + value
            continue
        words = shell.words(line)
        for i, word in enumerate(words):
            module = next((ep for ep in ENTRY_POINTS if word == ep or word.endswith("/" + ep + ".py")), None)
            if module is None:
                continue
            overrides = []
            for arg in words[i + 1:]:
                if arg in _STOP_WORDS or arg.startswith((">", "2>")):
                    break
                overrides.append(arg)
            reading.entry_point = module
            reading.overrides = overrides
            break
    if reading.entry_point is None:
        shell.warn("no `python3 -m verl.trainer.main_ppo ...` command found")
    reading.overrides = [o.replace(_NBSP, " ") for o in reading.overrides]
    reading.warnings = shell.warnings
    return reading
