"""Rule scorers, chosen by the row's ``data_source`` (the registry ``SCORERS``), with verl's dispatch names.

Every scorer has one signature, ``scorer(solution_str, ground_truth, extra_info=None, **kwargs) -> dict``, and
returns at least ``score`` (the reward), ``acc`` (1.0 when the answer is right, else 0.0) and ``pred`` (the answer
it extracted, "" when none), which the trainer logs. Keyword arguments a scorer does not know are ignored, so one
``custom_reward_function.reward_kwargs`` (e.g. ``method: flexible``) can serve a mix of data sources.

    data_source                                           scorer   score (right / wrong)
    openai/gsm8k                                          gsm8k    1 / 0   (verl: 1 / format_score=0)
    lighteval/MATH, DigitalLearningGmbH/MATH-lighteval,   math     1 / 0   (last \\boxed{}, rules then math-verify)
      HuggingFaceH4/MATH-500
    math_dapo, math, math_dapo_reasoning, aime*           math_dapo 1 / -1 (verl's DAPO scorer: "Answer: x" line
                                                                   first, else the last \\boxed{})
    arith                                                 arith    1 / 0   (\\boxed{} or the last integer)
    shapes                                                shapes   1 / 0   (the visual counting task; as arith)
    hiyouga/geometry3k                                    geo3k    1 / 0.1 / 0 (verl's geo3k: 0.9 x boxed answer
                                                                   right + 0.1 x "<think>...</think>...\\boxed{}")

``default_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)`` is verl's function
of the same name: the default reward function, and the fallback a custom function can call.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

from npu_rl.reward.math_utils import last_boxed, last_number, math_answers_equal, to_number
from npu_rl.utils.registry import Registry

Scorer = Callable[..., dict]
SCORERS: Registry[Scorer] = Registry("reward scorer", "data_source")
PREFIX_SCORERS = {"aime": "math_dapo"}  # data_source prefix -> registered name (verl: startswith("aime"))

_GSM8K_STRICT = re.compile(r"####\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")
_MINERVA_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


def _result(correct: bool, pred: Optional[str], right: float = 1.0, wrong: float = 0.0) -> dict[str, Any]:
    return {"score": right if correct else wrong, "acc": 1.0 if correct else 0.0, "pred": pred or ""}


def _numbers_equal(pred: str, ground_truth: Any) -> bool:
    pred_num, gold_num = to_number(pred), to_number(str(ground_truth))
    if pred_num is not None and gold_num is not None:
        return pred_num == gold_num
    return pred.strip() == str(ground_truth).strip()


# ------------------------------------------------------------------------------------------------ gsm8k
def extract_gsm8k(solution_str: str, method: str = "strict") -> Optional[str]:
    """strict: the number after the last ``####`` (verl's format check); flexible: the last number anywhere."""
    if method == "strict":
        matches = _GSM8K_STRICT.findall(solution_str)
        return matches[-1].replace(",", "") if matches else None
    if method == "flexible":
        return last_number(solution_str)
    raise ValueError(f"gsm8k scorer: method must be 'strict' or 'flexible', got {method!r}")


@SCORERS.register("openai/gsm8k", "gsm8k")
def gsm8k_score(solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None, method: str = "strict",
                format_score: float = 0.0, score: float = 1.0, **_: Any) -> dict[str, Any]:
    """Right answer ``score``; a well-formed wrong answer ``format_score``; no answer 0 (verl's defaults: 1, 0)."""
    pred = extract_gsm8k(solution_str, method)
    correct = pred is not None and _numbers_equal(pred, ground_truth)
    out = _result(correct, pred, right=score, wrong=format_score)
    if pred is None:
        out["score"] = 0.0
    return out


# ------------------------------------------------------------------------------------------------ MATH
@SCORERS.register("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
def math_score(solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None,
               use_math_verify: bool = True, **_: Any) -> dict[str, Any]:
    """The last ``\\boxed{}`` against the ground truth: normalised strings, then math-verify."""
    pred = last_boxed(solution_str)
    return _result(math_answers_equal(pred, str(ground_truth), use_math_verify), pred)


@SCORERS.register("math_dapo", "math", "math_dapo_reasoning")
def math_dapo_score(solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None,
                    use_math_verify: bool = True, **_: Any) -> dict[str, Any]:
    """verl's DAPO / AIME scorer: an ``Answer: x`` line first, else the last ``\\boxed{}``; +1 right, -1 wrong.

    As verl, only the last 300 characters are read (long reasoning never hides an answer at the end).
    """
    tail = solution_str[-300:]
    lines = _MINERVA_ANSWER.findall(tail)
    pred = lines[-1].strip() if lines else last_boxed(tail)
    if pred is not None:
        pred = pred.strip().strip("$").strip()
    return _result(math_answers_equal(pred, str(ground_truth), use_math_verify), pred, right=1.0, wrong=-1.0)


# ------------------------------------------------------------------------------------------------ geo3k
_GEO3K_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


@SCORERS.register("hiyouga/geometry3k")
def geo3k_score(solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None, format_score: float = 0.1,
                use_math_verify: bool = True, **_: Any) -> dict[str, Any]:
    """verl's geo3k scorer (verl/utils/reward_score/geo3k.py): ``(1 - format_score) x acc + format_score x format``,
    acc from the last ``\\boxed{}`` (verl grades with mathruler's ``grade_answer``; here the MATH comparison:
    normalised strings, then math-verify), format 1 when the whole text is ``<think>...</think>...\\boxed{...}...``."""
    pred = last_boxed(solution_str)
    correct = math_answers_equal(pred, str(ground_truth), use_math_verify)
    formatted = _GEO3K_FORMAT.fullmatch(solution_str) is not None
    out = _result(correct, pred)
    out["score"] = (1.0 - format_score) * float(correct) + format_score * float(formatted)
    return out


# ------------------------------------------------------------------------------------------------ arith
@SCORERS.register("arith")
def arith_score(solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None, **_: Any) -> dict[str, Any]:
    """The generated arithmetic task: the boxed answer if any, else the last number; compared as numbers."""
    pred = last_boxed(solution_str)
    if pred is None:
        pred = last_number(solution_str)
    return _result(pred is not None and _numbers_equal(pred, ground_truth), pred)


@SCORERS.register("shapes")
def shapes_score(solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None, **_: Any) -> dict[str, Any]:
    """The generated shape-counting task (npu_rl/data/shapes.py): the count read as ``arith`` reads an answer."""
    return arith_score(solution_str, ground_truth, extra_info)


# ------------------------------------------------------------------------------------------------ dispatch
def scorer_for(data_source: str) -> Optional[Scorer]:
    if data_source in SCORERS:
        return SCORERS.get(data_source)
    for prefix, name in PREFIX_SCORERS.items():
        if isinstance(data_source, str) and data_source.startswith(prefix):
            return SCORERS.get(name)
    return None


def check_data_sources(data_sources) -> None:
    """Fail (whatever reward_model.tolerate_errors says) if a data source has no rule scorer."""
    missing = sorted({str(ds) for ds in data_sources if scorer_for(ds) is None})
    if missing:
        known = ", ".join(SCORERS.names() + [p + "*" for p in PREFIX_SCORERS])
        raise ValueError(f"no rule scorer for data_source {missing}; known: {known}. Write a reward function and "
                         "set custom_reward_function.path / .name, or register a scorer in npu_rl.reward.SCORERS")


def default_compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None,
                          **kwargs: Any) -> dict[str, Any]:
    """verl's ``default_compute_score``: the rule scorer of ``data_source`` (see the table above)."""
    scorer = scorer_for(data_source)
    if scorer is None:
        check_data_sources([data_source])
    return scorer(solution_str, ground_truth, extra_info, **kwargs)


def default_batch_compute_score(data_sources, solution_strs, ground_truths, extra_infos, **kwargs) -> list[dict]:
    """The default function of the ``batch`` manager: ``default_compute_score`` over lists (verl's batch signature)."""
    return [default_compute_score(ds, s, gt, ei, **kwargs)
            for ds, s, gt, ei in zip(data_sources, solution_strs, ground_truths, extra_infos)]
