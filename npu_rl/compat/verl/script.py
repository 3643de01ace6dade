"""Read the overrides a verl run script passes to ``main_ppo``: bash itself expands the script, and runs nothing else.

The script runs in a restricted bash (``set -r``) with recording stubs: no ``PATH`` (every command is "not found"
and goes to ``command_not_found_handle``, which records its words and fails as a missing program would), no output
redirection and no input redirection from a file (``$(< ~/.token)``, ``read T < f``: blanked, so no file's contents
reach the output), no ``cd``, no command named by a path, ``kill`` / ``history`` / ``fc`` switched off (and ``enable``, so
that they stay off), an empty working
folder, ``/dev/null`` for input, and limits on time, memory, output and processes. So variables, ``export``, arrays, ``case``,
``if``, arithmetic, backticks and ``$(...)`` behave as bash has them, and the one command that matters (the trainer
call) is recorded with its arguments fully expanded. ``set -e`` and ``set +u`` in the script are not applied, so
that a missing program does not end the reading; ``set -u`` is on, so that a variable the script uses but never
sets is named (then read as empty, as bash would).

What the reading cannot know is said in ``warnings``: a variable the script uses but nobody set (empty; give it
with ``env``), the commands that were not run (their output is empty). The script's bash sees only the variables
of the environment that the script names (``declare -p`` or ``/proc/self/environ`` cannot list the rest of the
process environment into an override). Secrets are never read from the environment: a variable whose name looks like a secret (``*_API_KEY``, ``*_TOKEN`` ...: the rule of
:mod:`npu_rl.utils.redact`) is kept as ``$NAME``. A script that is not text, does not parse, runs too long or takes too much memory is refused
(:class:`ScriptError`) naming the line where bash says.

Processes: with no program to run, the only processes a script can make are bash's own forks (subshells, pipelines,
``&``, ``$(...)``), all in bash's own session (``set -m`` / ``set -o monitor`` are dropped like ``set -e``; ``builtin
set -m`` still gives jobs groups of their own, but not a session). ``RLIMIT_NPROC`` would not bound them where it
matters (it does not bind root, and counts every process of the user, not ours), so while bash runs the reader
counts the processes of that session (``/proc``: when the machine's thread total, checked every 10 ms, has grown
by more than the limit, and every ``COUNT_EVERY_S`` whatever the total says, since other programs' threads ending
meanwhile can hide the growth from it) and kills them all once there are more than ``MAX_PROCESSES``: a fork bomb
is refused in a few tens of milliseconds, at most a few dozen processes past the limit (more on a loaded machine:
counting takes ~0.5 ms a process there; a few hundred where other threads ended meanwhile and only the 50 ms count
saw it), and they are killed until none is left, as they are when bash ends.
"""

from __future__ import annotations

import fnmatch
import os
import re
import resource
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field

from npu_rl.utils.redact import is_secret_name

ENTRY_POINTS = ("verl.trainer.main_ppo", "recipe.dapo.main_dapo", "npu_rl.trainer.main_ppo", "main_ppo", "main_dapo",
                # the asynchronous trainers (docs/async.md)
                "verl.experimental.one_step_off_policy.main_ppo", "verl.experimental.fully_async_policy.fully_async_main",
                "npu_rl.experimental.one_step_off_policy.main_ppo",
                "npu_rl.experimental.fully_async_policy.fully_async_main",
                # verl-recipe's PRIME (npu_rl.trainer.main_prime, config prime_trainer)
                "recipe.prime.main_prime", "npu_rl.trainer.main_prime")
# other trainers of verl's recipes: recognised (and reported as what they are), not translated
OTHER_TRAINERS = ("recipe.*main*", "verl.experimental.*main*")
MAX_BYTES = 1 << 20  # a run script is a few kB; a larger file is not one
TIME_LIMIT_S = 5.0  # for the whole reading (every pass)
MEMORY_LIMIT = 512 << 20  # address space of the bash process
OUTPUT_LIMIT = 8 << 20  # bytes bash may write (the record, stdout, stderr)
MAX_PROCESSES = 64  # bash's forks alive at once (a run script needs a handful: $(...), pipelines)
PROCESS_POLL_S = 0.01
COUNT_EVERY_S = 0.05  # the session is counted at least this often while bash runs (~3 ms a count here)
MAX_PASSES = 40  # one more pass per variable the script uses without setting it
# never handed to the script's bash: they change how bash starts or looks commands up
_SHELL_VARIABLES = {"ENV", "BASH_ENV", "SHELLOPTS", "BASHOPTS", "IFS", "PS4", "PATH", "CDPATH", "GLOBIGNORE",
                    "PROMPT_COMMAND", "POSIXLY_CORRECT", "EXECIGNORE", "HISTFILE", "BASH_XTRACEFD", "SHELL"}

_ENTRY_CASE = "|".join([f"{ep}|*/{ep.rsplit('.', 1)[-1]}.py" for ep in ENTRY_POINTS] + list(OTHER_TRAINERS))
# Defined before ``set -r`` (one line, so that the script's line N is line N + 1 of what bash reads). The handler
# writes line, word count and words, NUL-separated, to file descriptor 3; the trainer call succeeds, others fail.
_PREAMBLE = (
    "command_not_found_handle() { builtin printf '%s\\0' \"${BASH_LINENO[0]}\" \"$#\" \"$@\" >&3; "
    "local w; for w in \"$@\"; do case \"$w\" in " + _ENTRY_CASE + ") return 0;; esac; done; return 127; }; "
    # set -e / set +u / set -x / set -m of the script are not applied (-u stays on: an unset variable is reported;
    # no job control: every process the script makes stays in bash's process group)
    "set() { local a skip= out=(); for a in \"$@\"; do "
    "if [[ -n $skip ]]; then skip=; case $a in errexit|nounset|xtrace|monitor) builtin unset 'out[-1]';; "
    "*) out+=(\"$a\");; "
    "esac; continue; fi; "
    "case $a in -o|+o) skip=1; out+=(\"$a\");; -*) a=${a//[exm]/}; [[ $a == - ]] || out+=(\"$a\");; "
    "+*) a=${a//u/}; [[ $a == + ]] || out+=(\"$a\");; *) out+=(\"$a\");; esac; done; "
    "(( ${#out[@]} )) && builtin set \"${out[@]}\"; return 0; }; "
    "{move}enable -n kill history fc suspend disown enable; builtin set -u; {declares}builtin set -r"
)
_UNBOUND = re.compile(r"line (\d+): (?:\$)?([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(\[[@*]\])?: unbound variable")
_LINE = re.compile(r"^.*?: line (\d+): ", re.MULTILINE)


class ScriptError(ValueError):
    """The script cannot be read (not text, not valid bash, too slow or too large); the message says where."""


@dataclass
class ScriptReading:
    overrides: list[str] = field(default_factory=list)
    entry_point: str | None = None
    line: int | None = None  # the trainer call's line in the script
    warnings: list[str] = field(default_factory=list)


def check_text(data: bytes, source: str) -> str:
    """The script's text; ScriptError for a file that is not a text script (binary, NUL bytes, not UTF-8)."""
    if len(data) > MAX_BYTES:
        raise ScriptError(f"{source}: more than {MAX_BYTES // 1024} kB; not a run script")
    if b"\0" in data:
        line = data[: data.index(b"\0")].count(b"\n") + 1
        raise ScriptError(f"{source}: line {line}: a NUL byte; not a text script")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ScriptError(f"{source}: line {line}: not UTF-8 text (byte {data[exc.start]:#04x}); not a text "
                          "script") from None


def read_file(path: str) -> bytes:
    """At most ``MAX_BYTES + 1`` bytes of ``path`` (``/dev/zero`` ends too); OSError as open() raises it."""
    if not os.path.isfile(path):
        raise OSError(f"{path} is not a regular file")
    with open(path, "rb") as f:
        return f.read(MAX_BYTES + 1)


def _environment(env: dict[str, str], placeholders: set[str], text: str) -> dict[str, str]:
    """What the script's bash sees: the variables of ``env`` that ``text`` names, without the shell's own switches;
    secrets and unset names as text."""
    named = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
    out = {}
    for name, value in env.items():
        if name not in named or name in _SHELL_VARIABLES or name.startswith("BASH"):
            continue
        out[name] = f"${name}" if is_secret_name(name) else value
    out.update({name: "" for name in placeholders})  # unset: empty, as bash reads it (and ${X:-default} works)
    return out


def _limits() -> None:  # in the child, before bash starts
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_LIMIT, OUTPUT_LIMIT))
    resource.setrlimit(resource.RLIMIT_CPU, (int(TIME_LIMIT_S) + 1, int(TIME_LIMIT_S) + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _bash() -> str:
    found = shutil.which("bash")
    if found is None:
        raise ScriptError("reading a run script needs bash, and none is on PATH")
    return found


def _run_bash(program: str, environment: dict[str, str], timeout: float, *flags: str) -> tuple[bytes, str, int]:
    """(the record, stderr, exit status) of bash running ``program`` under the limits. The record is a file the
    program writes to as descriptor 3 (``{move}`` in the program moves it there)."""
    with tempfile.TemporaryDirectory(prefix="npu_rl_migrate_") as folder:
        work, empty = os.path.join(folder, "work"), os.path.join(folder, "no-programs")
        os.mkdir(work)
        os.mkdir(empty)
        environment = {**environment, "PATH": empty}  # nothing can be found (and `set -r` keeps it so)
        with open(os.path.join(folder, "record"), "w+b") as record, \
                open(os.path.join(folder, "stderr"), "w+b") as stderr:
            path = os.path.join(folder, "script.sh")
            with open(path, "w", encoding="utf-8") as f:
                fd = record.fileno()
                f.write(program.replace("{move}", "" if fd == 3 else f"exec 3>&{fd} {fd}>&-; "))
            process = subprocess.Popen(
                [_bash(), "--noprofile", "--norc", *flags, path], cwd=work, env=environment,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, pass_fds=(record.fileno(),),
                preexec_fn=_limits, start_new_session=True)
            try:
                status = _wait_bounded(process, timeout)
            except subprocess.TimeoutExpired:
                raise ScriptError(f"the script did not finish within {TIME_LIMIT_S:.0f} s of reading (a loop that "
                                  "never ends?)") from None
            finally:
                _kill_all(process)
            record.seek(0)
            stderr.seek(0)
            return record.read(OUTPUT_LIMIT), stderr.read(64 * 1024).decode("utf-8", "replace"), status


class TooManyProcesses(ScriptError):
    """The script's bash had more than ``MAX_PROCESSES`` processes at once (a fork bomb, a loop of ``( ... ) &``)."""


def _session_groups(sid: int) -> dict[int, int]:
    """{process group: live processes} of session ``sid`` now (zombies are dead: their parent or init reaps them).
    bash leads its own session and a script cannot leave it (no program runs, ``setsid`` is not a builtin), while
    ``builtin set -m`` could still give its top-level jobs groups of their own: so the session is what is bounded."""
    groups: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:  # gone meanwhile
                continue
            state, _, group, session = stat[stat.rindex(b")") + 2:].split()[:4]  # the fields after "(comm)"
            if state != b"Z" and int(session) == sid:
                groups[int(group)] = groups.get(int(group), 0) + 1
    return groups


def _threads_total() -> int:
    """Every thread of the machine (the 4th field of /proc/loadavg, "running/total"): one cheap read; 0 without it."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return int(f.read().split()[3].split(b"/")[1])
    except (OSError, IndexError, ValueError):
        return 0


def _wait_bounded(process: subprocess.Popen, timeout: float) -> int:
    """``process.wait(timeout)``, bounding the processes of its session meanwhile (module docstring). Counting reads
    every process's /proc entry (~0.5 ms each here), so it is done when the machine's thread total has grown by more
    than ``MAX_PROCESSES`` since the last count, and otherwise every ``COUNT_EVERY_S``: the total alone is a shortcut,
    not a bound: other programs' threads that end while the script forks cancel its growth there, and a bomb
    hidden so ran into the time limit uncounted (the fork-bomb test failed so on a loaded machine). bash's group is
    stopped while it is counted (SIGSTOP, then SIGCONT), so that a bomb neither grows during the count nor takes the
    CPU the count needs (under load: 14,640 processes counted in 1.5 s stopped, 30,798 in 32 s not stopped)."""
    import time

    end = time.monotonic() + timeout
    baseline = _threads_total()
    counted = time.monotonic()
    while True:
        try:
            status = process.wait(timeout=min(PROCESS_POLL_S, max(0.0, end - time.monotonic())))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= end:
                raise
            status = None
        if baseline and (_threads_total() - baseline > MAX_PROCESSES or time.monotonic() - counted >= COUNT_EVERY_S):
            counted = time.monotonic()
            frozen = _killpg(process.pid, signal.SIGSTOP)  # bash's group forks no more while it is counted
            count = sum(_session_groups(process.pid).values())
            if frozen and count <= MAX_PROCESSES:
                _killpg(process.pid, signal.SIGCONT)
            if count > MAX_PROCESSES:
                _kill_all(process)
                raise TooManyProcesses(f"the script started more than {MAX_PROCESSES} processes at once ({count} "
                                       "seen; a fork bomb, or a loop of subshells or '&' jobs?); reading stopped")
            baseline = _threads_total() - count  # the rest of the growth is somebody else's
        if status is not None:
            return status


def _killpg(group: int, signum: int = signal.SIGKILL) -> bool:
    """SIGKILL (or ``signum``) to a whole process group (Linux fails a fork that races it); False when the group is
    empty."""
    try:
        os.killpg(group, signum)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _kill_all(process: subprocess.Popen) -> None:
    """bash's group first (bash, its subshells and jobs; bash reaped), so no new group can be made; then every
    other group of its session (top-level jobs under ``builtin set -m``), a group at a time, never a process at a
    time (a forking member would outrun that). Each until it is empty, at most ~2 s in all. The session is always
    scanned once (~1 ms per 50 processes): the machine's thread total cannot tell whether jobs were left behind, as
    other programs' threads come and go meanwhile."""
    import time

    if _killpg(process.pid):
        process.wait()  # a zombie bash would keep its group "non-empty"
        for _ in range(100):
            time.sleep(0.005)
            if not _killpg(process.pid):
                break
    process.wait()
    for _ in range(10):
        groups = _session_groups(process.pid)
        if not groups:
            return
        for group in groups:
            _killpg(group)
        time.sleep(0.02)


def _skip_quoted(text: str, i: int) -> int:
    """The index after the quoted string or escaped character at ``text[i]``."""
    if text[i] == "\\":
        return i + 2
    quote, i = text[i], i + 1
    while i < len(text) and text[i] != quote:
        i += 2 if quote == '"' and text[i] == "\\" else 1
    return i + 1


def _substitutions(text: str, start: int, stop: int) -> list[tuple[int, int]]:
    """The (start, stop) spans of the commands of ``$(...)`` and ``...`` substitutions in ``text[start:stop]`` (the
    inside of a double-quoted string), outermost only."""
    spans, i = [], start
    while i < stop:
        if text[i] == "\\":
            i += 2
        elif text.startswith("$(", i) and not text.startswith("$((", i):
            depth, j = 1, i + 2
            while j < stop and depth:
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            spans.append((i + 2, j - 1 if depth == 0 else j))
            i = j
        elif text[i] == "`":
            j = text.find("`", i + 1, stop)
            j = stop if j < 0 else j
            spans.append((i + 1, j))
            i = j + 1
        else:
            i += 1
    return spans


def _target_end(text: str, i: int) -> int:
    """The index after the word (a redirection's target) that starts at or after ``text[i]``."""
    while i < len(text) and text[i] in " \t":
        i += 1
    while i < len(text) and not text[i].isspace() and text[i] not in ";|&<>()`":
        i = _skip_quoted(text, i) if text[i] in "'\"\\" else i + 1
    return i


def without_file_redirections(text: str) -> str:
    """``text`` with every redirection that writes a file (``> f``, ``2>> f``, ``&> f``, ``>| f``, ``<> f``) or
    reads one (``< f``, ``$(< f)``, ``3< f``) blanked out, line breaks kept; duplications (``2>&1``, ``<&3``),
    ``>(...)``, ``<(...)``, here-documents and here-strings (``<<``, ``<<<``), ``(( a > b ))`` and ``[[ a > b ]]``
    stay. Restricted bash refuses a command that writes a file, and the trainer call often has ``> log 2>&1``; a file
    read would put its contents (a token) into the printed overrides."""
    out, i, word_start = list(text), 0, True
    closers = {"((": "))", "[[": "]]"}
    while i < len(text):
        ch = text[i]
        if ch in "'\"\\":
            end = _skip_quoted(text, i)
            if ch == '"':  # "$(< f)" and "`< f`" are expanded inside double quotes
                for start, stop in _substitutions(text, i + 1, min(end, len(text)) - 1):
                    out[start:stop] = without_file_redirections(text[start:stop])
            i, word_start = end, False
            continue
        if ch == "#" and word_start:
            i = text.find("\n", i) if "\n" in text[i:] else len(text)
            continue
        if text[i:i + 2] in closers:
            end = text.find(closers[text[i:i + 2]], i + 2)
            i = len(text) if end < 0 else end + 2
            continue
        start = i
        if word_start and ch.isdigit():
            while i < len(text) and text[i].isdigit():
                i += 1
        here = re.match(r"<<<|<<", text[i:])
        if here:  # a here-string or here-document: text of the script itself, not a file
            i, word_start = i + here.end(), False
            continue
        operator = re.match(r"&>>|&>|>>|>\||<>|>(?![(&])|>&(?![0-9-])|<(?![(&])", text[i:])
        if operator and (i == start or text[i] in "<>"):
            end = _target_end(text, i + operator.end())
            for j in range(start, end):
                out[j] = " " if out[j] != "\n" else "\n"
            i, word_start = end, False
            continue
        i = start + 1
        word_start = ch.isspace() or ch in ";|&()"
    return "".join(out)


def _records(data: bytes) -> list[tuple[int, list[str]]]:
    """(line, words) of each command the handler recorded."""
    fields = data.decode("utf-8", "replace").split("\0")
    out, i = [], 0
    while i + 1 < len(fields):
        try:
            line, count = int(fields[i]), int(fields[i + 1])
        except ValueError:
            break
        out.append((line - 1, fields[i + 2: i + 2 + count]))
        i += 2 + count
    return out


def _entry_point(word: str) -> str | None:
    """The trainer module ``word`` names (a module, or a file of one of ours), or None."""
    for ep in ENTRY_POINTS:
        if word == ep or word.endswith("/" + ep.rsplit(".", 1)[-1] + ".py"):
            return ep
    return word if any(fnmatch.fnmatchcase(word, pattern) for pattern in OTHER_TRAINERS) else None


def _script_lines(message: str) -> str:
    """bash's message with its line numbers turned into the script's (the preamble is line 1)."""
    return _LINE.sub(lambda m: f"line {int(m.group(1)) - 1}: ", message.strip())


def read_script(text: str, env: dict[str, str] | None = None) -> ScriptReading:
    """The overrides of the script's trainer call (see the module docstring); ScriptError where it cannot be read."""
    import time

    deadline = time.monotonic() + TIME_LIMIT_S
    placeholders: set[str] = set()
    arrays: set[str] = set()
    reading = ScriptReading()
    syntax = _run_bash("\n" + text, {}, TIME_LIMIT_S, "-n")
    if syntax[2] != 0:
        raise ScriptError(f"not a valid bash script: {_script_lines(syntax[1]).splitlines()[0]}")
    nounset = True
    for _ in range(MAX_PASSES):
        declares = "".join(f"declare -a {name}=(); " for name in sorted(arrays)) + ("" if nounset else "builtin set +u; ")
        program = _PREAMBLE.replace("{declares}", declares) + "\n" + without_file_redirections(text)
        record, stderr, status = _run_bash(program, _environment(env or {}, placeholders, text),
                                           max(0.1, deadline - time.monotonic()))
        if status < 0 or "cannot allocate" in stderr:
            raise ScriptError(_limit_message(status, stderr))
        unbound = _UNBOUND.search(stderr)
        if unbound is None:
            break
        line, name, is_array = int(unbound.group(1)) - 1, unbound.group(2), unbound.group(3)
        if name.isdigit():  # an argument of the script: none are given, so bash's own reading (empty) from here
            reading.warnings.append(f"line {line}: ${name} (an argument of the script) is not set: read as empty, "
                                    "and so is any other variable the script does not set")
            nounset = False
            continue
        if is_array:
            arrays.add(name)
            reading.warnings.append(f"line {line}: the array {name} is not set in the script: read as empty")
        else:
            placeholders.add(name)
            reading.warnings.append(f"line {line}: ${name} is not set: read as empty, as bash would (give it with "
                                    f"--env {name}=...)")
    else:
        raise ScriptError(f"the script uses more than {MAX_PASSES} variables it never sets")
    calls, skipped = [], []
    for line, words in _records(record):
        hit = next(((i, _entry_point(w)) for i, w in enumerate(words) if _entry_point(w)), None)
        if hit:
            calls.append((line, hit[1], words[hit[0] + 1:]))
        elif words:
            skipped.append(f"{words[0]} (line {line})")
    if skipped:
        reading.warnings.append("not run (migrate runs no command but the trainer call; each failed as a missing "
                                "program would, with no output): " + ", ".join(dict.fromkeys(skipped)))
    if not calls:
        return reading
    if len(calls) > 1:
        reading.warnings.append(f"the script calls the trainer {len(calls)} times (lines "
                                f"{', '.join(str(c[0]) for c in calls)}): the first call is read")
    reading.line, reading.entry_point, reading.overrides = calls[0]
    reading.warnings.extend(_secret_warnings(reading.overrides, env or {}))
    return reading


def _secret_warnings(overrides: list[str], env: dict[str, str]) -> list[str]:
    names = sorted({m.group(1) for o in overrides for m in re.finditer(r"\$([A-Za-z_][A-Za-z0-9_]*)", o)
                    if is_secret_name(m.group(1)) and m.group(1) in env})
    return [f"${name} is a secret: kept as ${name} (never read from the environment)" for name in names]


def _limit_message(status: int, stderr: str) -> str:
    said = _script_lines(stderr).splitlines()
    last = f" (bash: {said[-1]})" if said else ""
    if status == -signal.SIGXCPU:
        return f"the script used more than {TIME_LIMIT_S:.0f} s of processor time{last}"
    if status == -signal.SIGXFSZ:
        return f"the script wrote more than {OUTPUT_LIMIT >> 20} MiB{last}"
    if "cannot allocate" in stderr or status in (-signal.SIGSEGV, -signal.SIGABRT):
        return f"the script took more than {MEMORY_LIMIT >> 20} MiB of memory{last}"
    return f"bash was stopped by signal {-status} while reading the script{last}"
