"""The judge's template, parser and step scoring against hand-written texts (a tiny random judge writes noise, so
its plumbing is tested end to end elsewhere: tests/e2e/test_judge.py)."""

from __future__ import annotations

import json

import pytest
import torch

from npu_rl.config.reward_schema import JUDGE_SCORE_PATTERN, JUDGE_TEMPLATE
from npu_rl.data.dataset import object_array
from npu_rl.protocol import Batch
from npu_rl.reward.judge import (
    Judge,
    JudgeParseError,
    JudgeSettings,
    parse_score,
    pattern_problems,
    problem_text,
    render_prompt,
    score_with_judge,
    template_problems,
)
from tests.helpers import make_tiny_tokenizer


def settings(fallback=None, template=JUDGE_TEMPLATE, pattern=JUDGE_SCORE_PATTERN) -> JudgeSettings:
    return JudgeSettings(prompt_template=template, score_pattern=pattern, fallback_score=fallback)


@pytest.mark.parametrize("text,score", [
    ("The answer 12 matches the reference. \\boxed{1}", 1.0),
    ("wrong: 7 != 12 \\boxed{ 0 }", 0.0),
    ("first \\boxed{0}, on reflection \\boxed{1}", 1.0),  # the last match counts
    ("\\boxed{0.75}", 0.75),
    ("\\boxed{-1}", -1.0),
])
def test_scores_parse(text, score):
    assert parse_score(text, JUDGE_SCORE_PATTERN, "sample 0") == score


@pytest.mark.parametrize("text", ["I think it is right.", "\\boxed{yes}", "\\boxed{}", "\\boxed{1.2.3}", "boxed{1}"])
def test_unparsable_texts_raise_naming_the_sample(text):
    with pytest.raises(JudgeParseError, match=r"sample 3 of the step"):
        parse_score(text, JUDGE_SCORE_PATTERN, "sample 3 of the step")


def test_a_nan_score_is_refused():
    with pytest.raises(JudgeParseError, match="not a finite number"):
        parse_score("score: nan", r"score: (\w+)", "s")


def test_the_template_puts_problem_reference_and_response_in_place():
    prompt = render_prompt(JUDGE_TEMPLATE, "What is 5+7?", "It is 12.", 12)
    assert "[Problem]\nWhat is 5+7?\n\n[Reference answer]\n12\n\n[Response]\nIt is 12.\n\n" in prompt
    assert prompt.endswith("in \\boxed{}.")  # the doubled braces are literal ones
    assert "[Reference answer]\n\n" in render_prompt(JUDGE_TEMPLATE, "p", "r", None)


def test_template_and_pattern_problems():
    assert template_problems(JUDGE_TEMPLATE, "k") == []
    (unknown,) = template_problems("{problem} {answer} {response}", "k")
    assert "['answer']" in unknown
    (missing,) = template_problems("{problem} only", "k")
    assert "no {response}" in missing
    (braces,) = template_problems("\\boxed{} {response}", "k")
    assert "literal brace" in braces
    assert pattern_problems(JUDGE_SCORE_PATTERN, "k") == []
    assert "no group" in pattern_problems(r"\d+", "k")[0]
    assert "not a regular expression" in pattern_problems("(", "k")[0]


def test_problem_text_prefers_the_chat_then_extra_info_then_the_decoded_prompt():
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is 2+2?"}]
    assert problem_text(chat, {"question": "q"}, "decoded") == "What is 2+2?"
    assert problem_text(None, {"question": "q"}, "decoded") == "q"
    assert problem_text(None, {}, "decoded") == "decoded"


def test_judge_batches_the_step_and_counts_fallbacks():
    calls = []
    replies = {"good": "Correct. \\boxed{1}", "bad": "Wrong. \\boxed{0}", "noise": "x7#q"}

    def generate(prompts):
        calls.append(list(prompts))
        return [replies[p.split("[Response]\n")[1].split("\n")[0]] for p in prompts]

    judge = Judge(generate, settings(fallback=0.25))
    out = judge.judge(["p1", "p2", "p3"], ["good", "bad", "noise"], [1, 2, 3], ["s0", "s1", "s2"])
    assert len(calls) == 1 and len(calls[0]) == 3  # one call for the step
    assert out.scores == [1.0, 0.0, 0.25]
    assert len(out.failures) == 1 and out.failures[0].startswith("s2:")
    strict = Judge(generate, settings())
    with pytest.raises(JudgeParseError, match=r"s2: the judge's text has no score.*'x7#q'.*fallback_score"):
        strict.judge(["p1", "p3"], ["good", "noise"], [1, 3], ["s0", "s2"])


def test_generate_records_calls_when_asked(tmp_path):
    judge = Judge(lambda prompts: [p.upper() for p in prompts], settings())
    judge.calls_path, judge.step = str(tmp_path / "judge" / "3.jsonl"), 3
    assert judge.generate(["a", "b"]) == ["A", "B"]
    lines = [json.loads(line) for line in open(judge.calls_path)]
    assert lines == [{"step": 3, "prompt": "a", "judge": "A"}, {"step": 3, "prompt": "b", "judge": "B"}]
    with pytest.raises(TypeError):
        judge.generate([1])


def test_score_with_judge_puts_scores_on_the_last_token_and_writes_the_record(tmp_path):
    tok = make_tiny_tokenizer()
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt_ids = [enc("Q:5+7"), enc("Q:2+2")]
    width = max(map(len, prompt_ids))
    prompts = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompt_ids])
    responses = torch.tensor([enc("12") + [tok.pad_token_id], enc("5") + [tok.pad_token_id] * 2])
    response_mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    attention = torch.cat([(prompts != tok.pad_token_id).long(), response_mask], 1)
    batch = Batch({"prompts": prompts, "responses": responses, "response_mask": response_mask,
                   "attention_mask": attention},
                  {"ground_truth": object_array(["12", "4"]), "data_source": object_array(["arith", "arith"]),
                   "index": object_array([10, 11]), "extra_info": object_array([{}, {}])})
    seen = []

    def generate(prompts):
        seen.extend(prompts)
        return ["\\boxed{1}" if "[Response]\n12\n" in p else "\\boxed{0}" for p in prompts]

    record = tmp_path / "judge" / "1.jsonl"
    out, metrics = score_with_judge(batch, Judge(generate, settings()), tok, str(record), 1)
    assert out["token_level_scores"].tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    assert list(out["judge_score"]) == [1.0, 0.0] and metrics == {"reward/judge_parse_failures": 0.0}
    assert "[Problem]\nQ:5+7\n\n[Reference answer]\n12\n" in seen[0]
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert [r["score"] for r in rows] == [1.0, 0.0] and rows[1]["sample"].endswith("index=11)")
    assert rows[0]["judge"] == "\\boxed{1}" and not rows[0]["fallback"]
