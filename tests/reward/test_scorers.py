"""Rule scorers on real rows of the packaged data sets (npu_rl/data/sets), plus the extraction and normalisation rules one by one."""

from __future__ import annotations

import json
import os

import pytest

from npu_rl.data.preprocess import gsm8k_answer
from npu_rl.reward.math_utils import (
    last_boxed,
    last_number,
    math_verify_equal,
    normalize_math_answer,
    outer_alarm_active,
)
from npu_rl.reward.scorers import SCORERS, check_data_sources, default_compute_score


def _jsonl(packaged_data_dir, name):
    from npu_rl.data.io import read_jsonl
    from npu_rl.data.preprocess import find_raw_file

    return read_jsonl(find_raw_file(packaged_data_dir, name, "test"))


# ------------------------------------------------------------------------------------------------ GSM8K
def test_every_gsm8k_test_solution_scores_one_against_its_answer_and_zero_against_another(packaged_data_dir):
    rows = _jsonl(packaged_data_dir, "gsm8k")
    answers = [gsm8k_answer(r["answer"]) for r in rows]
    for method in ("strict", "flexible"):
        own = [default_compute_score("openai/gsm8k", r["answer"], a, method=method) for r, a in zip(rows, answers)]
        assert [o["score"] for o in own] == [1.0] * len(rows), method
        assert all(o["acc"] == 1.0 for o in own)
    for i, row in enumerate(rows):
        j = next(j for j in range(i + 1, i + len(rows)) if answers[j % len(rows)] != answers[i]) % len(rows)
        other = default_compute_score("openai/gsm8k", rows[j]["answer"], answers[i])
        assert other == {"score": 0.0, "acc": 0.0, "pred": answers[j]}


@pytest.mark.parametrize("text, method, pred, score", [
    ("so 1,000 + 234 = 1,234\n#### 1,234", "strict", "1234", 1.0),
    ("#### $1234", "strict", "1234", 1.0),
    ("#### 1234.00", "strict", "1234.00", 1.0),  # compared as numbers
    ("The answer is 1234", "strict", None, 0.0),  # strict needs '####'
    ("The answer is 1234.", "flexible", "1234", 1.0),
    ("#### 12 then 1234", "strict", "12", 0.0),
    ("no number at all", "flexible", None, 0.0),
])
def test_gsm8k_extraction(text, method, pred, score):
    out = default_compute_score("openai/gsm8k", text, "1234", method=method)
    assert out["pred"] == (pred or "") and out["score"] == score


def test_gsm8k_format_score_for_a_wrong_but_well_formed_answer():
    assert default_compute_score("openai/gsm8k", "#### 7", "8", format_score=0.1)["score"] == 0.1
    assert default_compute_score("openai/gsm8k", "seven", "8", format_score=0.1)["score"] == 0.0


# ------------------------------------------------------------------------------------------------ MATH-500
def test_math500_reference_boxed_answers(packaged_data_dir):
    """Measured: 500/500 reference solutions score 1.0 (the answer column is the solution's last box); the string
    rules alone already agree on all 500, and math-verify alone too (checked when this test was written)."""
    rows = _jsonl(packaged_data_dir, "math500")
    scores = [default_compute_score("HuggingFaceH4/MATH-500", r["solution"], r["answer"]) for r in rows]
    failures = [(r["unique_id"], s["pred"], r["answer"]) for r, s in zip(rows, scores) if s["score"] != 1.0]
    assert failures == []
    assert all(s["pred"] == r["answer"] for r, s in zip(rows, scores))


def test_math500_equivalent_rewrites_of_the_answers(packaged_data_dir):
    """Each answer rewritten as a model might write it (dfrac, spaces, \\left/\\right dropped, \\text{} units)."""
    rows = _jsonl(packaged_data_dir, "math500")
    rewrites = 0
    for r in rows:
        variant = (r["answer"].replace("\\frac", "\\dfrac").replace("\\left", "").replace("\\right", "")
                   .replace(",", ", "))
        if variant != r["answer"]:
            rewrites += 1
            assert default_compute_score("HuggingFaceH4/MATH-500", f"So \\boxed{{{variant}}}.", r["answer"])[
                "score"] == 1.0, (r["unique_id"], variant, r["answer"])
    assert rewrites > 80  # 92 of the 500 answers change under these rewrites


def test_math500_another_rows_answer_scores_zero(packaged_data_dir):
    rows = _jsonl(packaged_data_dir, "math500")[:80]  # math-verify runs on every mismatch: ~10-20 ms each
    mismatched = 0
    for i, row in enumerate(rows):
        other = rows[(i + 1) % len(rows)]
        if normalize_math_answer(other["answer"]) == normalize_math_answer(row["answer"]):
            continue
        mismatched += 1
        assert default_compute_score("HuggingFaceH4/MATH-500", other["solution"], row["answer"])["score"] == 0.0
    assert mismatched >= 75


@pytest.mark.parametrize("pred, gold", [
    ("\\frac12", "\\frac{1}{2}"),
    ("0.5", "\\frac{1}{2}"),
    ("x = 5", "5"),
    ("5\\text{ cm}", "5"),
    ("90^\\circ", "90"),
    ("\\text{(C)}", "(C)"),
    ("1,000", "1000"),
    ("3/4", "\\frac{3}{4}"),
])
def test_string_rules(pred, gold):
    assert default_compute_score("HuggingFaceH4/MATH-500", f"\\boxed{{{pred}}}", gold)["score"] == 1.0


def test_math_verify_catches_what_the_rules_miss():
    assert normalize_math_answer("\\sqrt{3}/2") != normalize_math_answer("\\frac{\\sqrt{3}}{2}")
    assert default_compute_score("HuggingFaceH4/MATH-500", "\\boxed{\\sqrt{3}/2}", "\\frac{\\sqrt{3}}{2}")["acc"] == 1
    assert default_compute_score("HuggingFaceH4/MATH-500", "\\boxed{\\sqrt{3}/2}", "\\frac{\\sqrt{3}}{2}",
                                 use_math_verify=False)["acc"] == 0
    assert default_compute_score("HuggingFaceH4/MATH-500", "\\boxed{(3,\\pi/2)}",
                                 "\\left( 3, \\frac{\\pi}{2} \\right)")["acc"] == 1
    assert default_compute_score("HuggingFaceH4/MATH-500", "\\boxed{\\sqrt{3}/3}", "\\frac{\\sqrt{3}}{2}")["acc"] == 0


def test_math_verify_off_the_main_thread_and_under_an_outer_alarm():
    """math-verify's own timeout uses signal.alarm: it must be switched off where that cannot work."""
    import threading

    results = []
    thread = threading.Thread(target=lambda: results.append(math_verify_equal("\\sqrt{3}/2", "\\frac{\\sqrt{3}}{2}")))
    thread.start()
    thread.join()
    assert results == [True]
    with outer_alarm_active():
        assert math_verify_equal("0.25", "\\frac14")


def test_boxed_extraction():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert last_boxed("\\fbox{7}") == "7" and last_boxed("$\\boxed 42$") == "42"
    assert last_boxed("\\boxed{unclosed") is None and last_boxed("none") is None
    assert last_number("costs $1,234.50 or -3") == "-3" and last_number("x") is None


def test_no_box_scores_zero():
    out = default_compute_score("HuggingFaceH4/MATH-500", "The answer is 5", "5")
    assert out == {"score": 0.0, "acc": 0.0, "pred": ""}


# ------------------------------------------------------------------------------------------------ AIME
def test_aime_reference_solutions_and_answer_lines(packaged_data_dir):
    """Measured: 25 of the 30 AIME 2024 reference solutions end in a box holding the answer; the other 5 box
    nothing (4) or box '\\textbf{(073)}' (1): those score -1, as verl's math_dapo does for a missing answer."""
    rows = _jsonl(packaged_data_dir, "aime24")
    results = [default_compute_score("aime2024", r["solution"], str(int(r["answer"]))) for r in rows]
    assert sum(r["acc"] for r in results) == 25
    assert {r["score"] for r in results} == {1.0, -1.0}
    for r in rows:
        answer = str(int(r["answer"]))
        assert default_compute_score("aime2024", f"...\nAnswer: {answer}", answer)["score"] == 1.0
        assert default_compute_score("aime2024", f"so \\boxed{{{r['answer']}}}", answer)["score"] == 1.0  # "025"
        assert default_compute_score("aime2024", "Answer: 1000", answer)["score"] == -1.0


def test_math_dapo_reads_only_the_tail():
    long = "Answer: 7\n" + "x" * 400 + "\\boxed{8}"
    assert default_compute_score("math_dapo", long, "8")["acc"] == 1.0


# ------------------------------------------------------------------------------------------------ arith
@pytest.mark.parametrize("text, score", [
    ("2 + 3 = 5", 1.0), ("The answer is 5.", 1.0), ("\\boxed{5} (not 6)", 1.0), ("5", 1.0), ("6", 0.0),
    ("five", 0.0), ("", 0.0),
])
def test_arith(text, score):
    assert default_compute_score("arith", text, "5")["score"] == score
    assert default_compute_score("arith", "3 - 7 = -4", "-4")["score"] == 1.0


# ------------------------------------------------------------------------------------------------ dispatch
def test_dispatch_names_follow_verl():
    for name in ("openai/gsm8k", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",
                 "math_dapo", "math", "arith"):
        assert name in SCORERS.names()
    assert default_compute_score("aime2025-I", "Answer: 3", "3")["score"] == 1.0  # any aime* source
    with pytest.raises(ValueError, match=r"no rule scorer for data_source \['my/data'\]; known: .*openai/gsm8k.*aime\*"):
        default_compute_score("my/data", "1", "1")
    with pytest.raises(ValueError, match="custom_reward_function.path"):
        check_data_sources(["arith", "my.data"])  # a dotted name is not mistaken for a plug-in path


# ------------------------------------------------------------------------------------------------ geo3k
def _verl_geo3k_format_reward(predict_str: str) -> float:
    """verl/utils/reward_score/geo3k.py (verl-project/verl 1dda039), format_reward, copied as the reference."""
    import re

    pattern = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)
    match_result = re.fullmatch(pattern, predict_str)
    return 1.0 if match_result else 0.0


@pytest.mark.parametrize("text,truth,acc", [
    ("<think>angles sum</think> so x = \\boxed{3}", "3", 1.0),      # 0.9 * 1 + 0.1 * 1 = 1.0
    ("x = \\boxed{3}", "3", 1.0),                                    # 0.9 * 1 + 0.1 * 0 = 0.9
    ("<think>a\nb</think>\n\\boxed{4} done", "3", 0.0),             # 0.9 * 0 + 0.1 * 1 = 0.1
    ("three", "3", 0.0),                                             # 0
    ("<think>r</think>\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
    ("<think>r</think>\\boxed{2\\sqrt{3}}", "2 \\sqrt{3}", 1.0),
])
def test_geo3k_is_verls_weighting(text, truth, acc):
    out = default_compute_score("hiyouga/geometry3k", text, truth)
    assert out["acc"] == acc
    assert out["score"] == pytest.approx(0.9 * acc + 0.1 * _verl_geo3k_format_reward(text))
