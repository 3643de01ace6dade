"""Answer extraction and comparison for math rewards: boxed answers, string normalisation, math-verify.

Two comparisons, cheapest first:

1. ``normalize_math_answer``: the string rules of Hendrycks et al.'s MATH grader (as in lm-eval and verl's
   ``math_reward``): drop spaces, ``\\left``/``\\right``, ``\\!``, degree signs, ``\\$``, ``\\%``, trailing units
   written ``\\text{ unit}``; ``tfrac``/``dfrac`` -> ``frac``; ``\\frac12`` -> ``\\frac{1}{2}``; ``\\sqrt3`` ->
   ``\\sqrt{3}``; ``a/b`` -> ``\\frac{a}{b}``; ``.5`` -> ``0.5``; a short ``x =`` prefix dropped. Plus a few of ours:
   ``\\text{...}`` unwrapped, a trailing ``.`` dropped, and numbers compared as numbers.
2. ``math_verify_equal``: Hugging Face's math-verify (sympy), which knows ``0.5 == \\frac{1}{2}`` and ``(3, \\pi/2)
   == \\left( 3, \\frac{\\pi}{2} \\right)``. It can be slow, and it guards itself with ``signal.alarm``, which only
   works in a process's main thread and clobbers any outer alarm. So its own timeouts are used only in the main
   thread and when no outer alarm is active (``outer_alarm_active``); the reward pool's process timeout is the
   outer guard everywhere.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from fractions import Fraction
from typing import Iterator, Optional

logger = logging.getLogger(__name__)

MATH_VERIFY_TIMEOUT_S = 5
_outer_alarm = threading.local()


# ------------------------------------------------------------------------------------------------ extraction
def last_boxed(text: str) -> Optional[str]:
    """The contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed 5``) in ``text``; None if absent."""
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    rest = text[idx:]
    command = "\\boxed" if rest.startswith("\\boxed") else "\\fbox"
    after = rest[len(command):]
    if after.startswith(" "):  # \boxed 5: up to the next $ or end of line
        return re.split(r"[$\n]", after[1:], maxsplit=1)[0].strip() or None
    if not after.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(after):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return after[1:i]
    return None  # unbalanced braces: no answer


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def last_number(text: str) -> Optional[str]:
    """The last number in ``text`` (``1,234`` and ``-3.5`` count), commas removed; None if there is none."""
    matches = _NUMBER.findall(text)
    return matches[-1].replace(",", "") if matches else None


def to_number(text: str) -> Optional[Fraction]:
    """``"12"``, ``"-3.50"``, ``"1,000"``, ``"3/4"`` -> an exact Fraction; None if ``text`` is not a plain number."""
    text = text.strip().replace(",", "").rstrip(".")
    if text.startswith("+"):
        text = text[1:]
    if not re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)(/\d+)?", text):
        return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


# ------------------------------------------------------------------------------------------------ normalisation
def _fix_fracs(s: str) -> str:
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if not part or part[0] == "{":
            out += part
            continue
        if len(part) < 2:
            return s
        a, b, rest = part[0], part[1], part[2:]
        out += "{" + a + "}" + ("{" + b + "}" + rest if b != "{" else b + rest)
    return out


def _fix_sqrt(s: str) -> str:
    return re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)


def _fix_a_slash_b(s: str) -> str:
    match = re.fullmatch(r"(-?\d+)/(\d+)", s)
    return f"\\frac{{{match.group(1)}}}{{{match.group(2)}}}" if match else s


def _unwrap_text(s: str) -> str:
    return re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)


def normalize_math_answer(answer: str) -> str:
    s = answer.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    if "\\text{ " in s:  # "5 \text{ cm}": a unit on the right
        s = s.split("\\text{ ")[0]
    s = _unwrap_text(s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    s = s.strip().rstrip(".").strip()
    if s.startswith("."):
        s = "0" + s
    pieces = s.split("=")
    if len(pieces) == 2 and len(pieces[0].strip()) <= 2:  # "x = 5" -> "5"
        s = pieces[1]
    s = _fix_sqrt(s).replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def answers_match_by_rules(prediction: str, ground_truth: str) -> bool:
    pred, gold = normalize_math_answer(prediction), normalize_math_answer(ground_truth)
    if pred == gold:
        return True
    pred_num, gold_num = to_number(pred), to_number(gold)
    return pred_num is not None and pred_num == gold_num


# ------------------------------------------------------------------------------------------------ math-verify
@contextlib.contextmanager
def outer_alarm_active() -> Iterator[None]:
    """Mark that the caller guards this thread with its own SIGALRM timer (math-verify must not touch alarms)."""
    previous = getattr(_outer_alarm, "active", False)
    _outer_alarm.active = True
    try:
        yield
    finally:
        _outer_alarm.active = previous


def _own_timeout() -> Optional[int]:
    main = threading.current_thread() is threading.main_thread()
    return MATH_VERIFY_TIMEOUT_S if main and not getattr(_outer_alarm, "active", False) else None


def math_verify_equal(prediction: str, ground_truth: str) -> bool:
    """Whether math-verify finds the two boxed answers equivalent; False when it cannot parse either or times out."""
    try:
        from math_verify import parse, verify
        from math_verify.errors import TimeoutException
    except ImportError:  # math-verify is a dependency; be explicit if an environment lacks it
        logger.warning("math-verify is not installed; math answers are compared by string rules only")
        return False
    timeout = _own_timeout()
    try:
        gold = parse("\\boxed{" + ground_truth + "}", parsing_timeout=timeout)
        pred = parse("\\boxed{" + prediction + "}", parsing_timeout=timeout)
        if not gold or not pred:
            return False
        return bool(verify(gold, pred, timeout_seconds=timeout))
    except TimeoutException:
        return False
    except Exception as exc:  # sympy raises many types on odd input; a parse failure is a wrong answer
        logger.debug("math-verify failed on %r vs %r: %s", prediction, ground_truth, exc)
        return False


def math_answers_equal(prediction: Optional[str], ground_truth: str, use_math_verify: bool = True) -> bool:
    if prediction is None or not prediction.strip():
        return False
    if answers_match_by_rules(prediction, ground_truth):
        return True
    return use_math_verify and math_verify_equal(prediction, ground_truth)
