"""A generative reward model (a judge): a causal LM served inside the job scores each response from its own text.

For each sample of the step::

    prompt_i = reward_model.judge.prompt_template.format(problem=..., response=..., reference=...)
    text_i   = the judge's generation for chat([user: prompt_i])       (one batched call for the whole step)
    score_i  = float(last match of reward_model.judge.score_pattern in text_i, its first group)

``problem`` is the row's question: the last user message of ``raw_prompt`` (``data.return_raw_chat=True``), else
``extra_info["question"]``, else the decoded prompt; ``response`` the decoded response; ``reference`` the row's
ground truth (empty when it has none). A text with no match, or a match that is not a finite number, stops the run
with an error naming the sample, the judge's text and the pattern; with ``reward_model.judge.fallback_score`` set,
such a sample scores that value instead and is counted in ``reward/judge_parse_failures`` (verl's GenRM examples
fall back silently: a parse failure scores 0 there). The judge's prompts and texts are written beside the samples,
``<run folder>/judge/<step>.jsonl``.

Custom reward functions may call the judge: a ``compute_score`` with a ``judge`` parameter receives a
:class:`Judge`, whose ``generate(prompts)`` returns the judge's texts for a list of user messages (one batched call).
"""

from __future__ import annotations

import json
import math
import os
import re
import string
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from npu_rl.data.dataset import object_array
from npu_rl.protocol import Batch
from npu_rl.reward.managers import decode_responses

TEMPLATE_FIELDS = ("problem", "response", "reference")


class JudgeParseError(ValueError):
    """The judge's text holds no score (named: the sample, the text, the pattern)."""


def template_problems(template: str, key: str) -> list[str]:
    """What is wrong with a prompt template: unknown or missing fields, bad braces."""
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        return [f"{key}: {exc} (write a literal brace as {{{{ or }}}})"]
    problems = []
    if "" in fields or any(name.isdigit() for name in fields):
        problems.append(f"{key} has a positional field ({{}}): write a literal brace as {{{{ or }}}}")
        fields = {name for name in fields if name and not name.isdigit()}
    unknown = sorted(fields - set(TEMPLATE_FIELDS))
    if unknown:
        problems.append(f"{key} names {unknown}; the fields are {{problem}}, {{response}}, {{reference}}")
    if "response" not in fields:
        problems.append(f"{key} has no {{response}}: the judge would never see the response it scores")
    return problems


def pattern_problems(pattern: str, key: str) -> list[str]:
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        return [f"{key}={pattern!r} is not a regular expression: {exc}"]
    if compiled.groups < 1:
        return [f"{key}={pattern!r} has no group: put the score in parentheses, e.g. \\\\boxed\\{{([0-9.]+)\\}}"]
    return []


def render_prompt(template: str, problem: str, response: str, reference: Any) -> str:
    return template.format(problem=problem, response=response, reference="" if reference is None else str(reference))


def parse_score(text: str, pattern: str, where: str) -> float:
    """The first group of the last match of ``pattern`` in ``text`` as a finite float; raises JudgeParseError."""
    matches = list(re.finditer(pattern, text))
    if not matches:
        raise JudgeParseError(f"{where}: the judge's text has no score matching {pattern!r}: {_clip(text)!r}")
    value = matches[-1].group(1)
    try:
        score = float(value)
    except (TypeError, ValueError):
        score = math.nan
    if not math.isfinite(score):
        raise JudgeParseError(f"{where}: the judge's score {value!r} is not a finite number (pattern {pattern!r}): "
                              f"{_clip(text)!r}")
    return score


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit // 2] + " ... " + text[-limit // 2:]


def problem_text(raw_prompt: Any, extra_info: Any, decoded_prompt: str) -> str:
    """The row's question for the template (module docstring)."""
    if isinstance(raw_prompt, (list, tuple)):
        users = [m.get("content") for m in raw_prompt if isinstance(m, dict) and m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    if isinstance(extra_info, dict) and isinstance(extra_info.get("question"), str):
        return extra_info["question"]
    return decoded_prompt


@dataclass
class JudgeSettings:
    """``reward_model.judge`` (and the judge's sampling, from ``reward_model.rollout``)."""

    prompt_template: str
    score_pattern: str
    fallback_score: float | None


@dataclass
class Judgement:
    scores: list[float]
    texts: list[str]
    prompts: list[str]
    failures: list[str]  # one message per sample that fell back (empty without a fallback)


class Judge:
    """The judge as reward code sees it: ``generate(prompts) -> texts`` (user messages in, the judge's replies out,
    one batched call to the engine) and ``judge(...)`` for the template-and-parse scoring of a step."""

    def __init__(self, generate_texts: Callable[[list[str]], list[str]], settings: JudgeSettings):
        self._generate_texts = generate_texts
        self.settings = settings
        self.calls_path: str | None = None  # set: every generate call's prompts and texts are appended there
        self.step = 0

    def generate(self, prompts: Sequence[str]) -> list[str]:
        prompts = list(prompts)
        if not all(isinstance(p, str) for p in prompts):
            raise TypeError("Judge.generate takes a list of strings (user messages)")
        texts = self._generate_texts(prompts) if prompts else []
        if len(texts) != len(prompts):
            raise RuntimeError(f"the judge returned {len(texts)} texts for {len(prompts)} prompts")
        if self.calls_path is not None and prompts:
            os.makedirs(os.path.dirname(self.calls_path) or ".", exist_ok=True)
            with open(self.calls_path, "a", encoding="utf-8") as f:
                for prompt, text in zip(prompts, texts):
                    f.write(json.dumps({"step": self.step, "prompt": prompt, "judge": text}, ensure_ascii=False)
                            + "\n")
        return texts

    def judge(self, problems: Sequence[str], responses: Sequence[str], references: Sequence[Any],
              names: Sequence[str]) -> Judgement:
        s = self.settings
        prompts = [render_prompt(s.prompt_template, p, r, ref) for p, r, ref in zip(problems, responses, references)]
        texts = self.generate(prompts)
        scores, failures = [], []
        for name, text in zip(names, texts):
            try:
                scores.append(parse_score(text, s.score_pattern, name))
            except JudgeParseError as exc:
                if s.fallback_score is None:
                    raise JudgeParseError(f"{exc}. Fix reward_model.judge.score_pattern or the template, or set "
                                          "reward_model.judge.fallback_score to score such samples (counted in "
                                          "reward/judge_parse_failures)") from None
                scores.append(float(s.fallback_score))
                failures.append(str(exc))
        return Judgement(scores, texts, prompts, failures)


def write_judgements(path: str, step: int, names: Sequence[str], judgement: Judgement) -> None:
    """One JSON line per sample: step, sample, prompt, the judge's text, score, whether it fell back."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    failed = {f.split(":", 1)[0] for f in judgement.failures}
    with open(path, "a", encoding="utf-8") as f:  # appended: dynamic sampling scores several batches a step
        for name, prompt, text, score in zip(names, judgement.prompts, judgement.texts, judgement.scores):
            f.write(json.dumps({"step": step, "sample": name, "prompt": prompt, "judge": text, "score": score,
                                "fallback": name in failed}, ensure_ascii=False) + "\n")


def sample_name(i: int, batch: Batch) -> str:
    index = batch["index"][i] if "index" in batch else None
    source = batch["data_source"][i] if "data_source" in batch else None
    return f"sample {i} of the step (data_source={source!r}, index={index})"


def score_with_judge(batch: Batch, judge: Judge, tokenizer, record_path: str | None, step: int
                     ) -> tuple[Batch, dict[str, float]]:
    """``batch`` with ``token_level_scores`` [B, R] (the judge's score on each row's last valid response token) and
    ``judge_score`` per row; metrics ``reward/judge_parse_failures``; the judgements written to ``record_path``."""
    responses, _, last = decode_responses(batch, tokenizer)
    prompts, attention = batch["prompts"].cpu(), batch["attention_mask"].cpu()
    problems, references, names = [], [], []
    for i in range(len(batch)):
        prompt_ids = prompts[i][attention[i, : prompts.shape[1]].bool()]
        decoded = tokenizer.decode(prompt_ids, skip_special_tokens=True)
        raw = batch["raw_prompt"][i] if "raw_prompt" in batch else None
        extra = batch["extra_info"][i] if "extra_info" in batch else None
        problems.append(problem_text(raw, extra, decoded))
        references.append(batch["ground_truth"][i] if "ground_truth" in batch else None)
        names.append(sample_name(i, batch))
    judgement = judge.judge(problems, responses, references, names)
    if record_path is not None:
        write_judgements(record_path, step, names, judgement)
    scores = torch.tensor(judgement.scores, dtype=torch.float32)
    token_level = torch.zeros(batch["response_mask"].shape, dtype=torch.float32)
    token_level[torch.arange(len(batch)), last] = scores
    scored = Batch({"token_level_scores": token_level}, {"judge_score": object_array(judgement.scores)})
    return batch.union(scored), {"reward/judge_parse_failures": float(len(judgement.failures))}


def judge_client(rm_config, judge_role) -> Judge | None:
    """The :class:`Judge` over a judge role (``generate_texts``), or None without one."""
    if judge_role is None:
        return None
    settings = JudgeSettings(prompt_template=str(rm_config.judge.prompt_template),
                             score_pattern=str(rm_config.judge.score_pattern),
                             fallback_score=None if rm_config.judge.fallback_score is None
                             else float(rm_config.judge.fallback_score))
    return Judge(judge_role.generate_texts, settings)
