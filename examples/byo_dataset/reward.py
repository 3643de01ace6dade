"""A reward for the rows prepare_hf_dataset.py writes: 1 when the last \\boxed{...} (else the last number) of the
response equals the ground truth as a number (or as text), else 0. Loaded by path, never imported by npu-rl:

    custom_reward_function.path=examples/byo_dataset/reward.py custom_reward_function.name=compute_score
"""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract(text: str) -> str | None:
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def same(a: str, b: str) -> bool:
    a, b = a.replace(",", "").strip(), b.replace(",", "").strip()
    try:
        return abs(float(a) - float(b)) < 1e-6
    except ValueError:
        return a == b


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    answer = extract(solution_str)
    correct = answer is not None and same(answer, str(ground_truth))
    return {"score": 1.0 if correct else 0.0, "acc": float(correct), "pred": answer or ""}
