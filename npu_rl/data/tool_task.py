"""The built-in calculator task (``builtin://arith_tool/{train,test}``): multi-digit multiplication that
SmolLM2-135M-Instruct gets wrong on its own but can answer by calling the calculator tool.

Rows are the generated arithmetic rows (:mod:`npu_rl.data.arith`; defaults here: two 3-digit operands, ``*``) with
a system prompt that shows the call format, one worked example as earlier turns (user question, assistant tool call,
tool reply, assistant answer), and ``agent_name: tool_agent``. The reward is the ``arith`` rule scorer on the
model's own tokens (tool output is masked out of the decoded response), so the answer must be written by the model.
"""

from __future__ import annotations

import json
from typing import Any

from npu_rl.data.arith import ArithSpec, generate_arith

TOOL_TASK_DEFAULTS = {"operators": "*", "min_digits": 3, "max_digits": 3, "num_train": 1000, "num_test": 64}
SYSTEM_PROMPT = ("You are a careful assistant with a calculator tool. Never multiply in your head: call the "
                 "calculator, then reply with the number it returns.")
EXAMPLE_QUESTION = "What is 25 * 12? Give only the answer."
EXAMPLE_EXPRESSION = "25 * 12"
EXAMPLE_RESULT = "300"


def tool_call_text(expression: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "calculator", "arguments": {"expression": expression}}) + \
        "\n</tool_call>"


def example_turns() -> list[dict[str, Any]]:
    return [{"role": "user", "content": EXAMPLE_QUESTION},
            {"role": "assistant", "content": tool_call_text(EXAMPLE_EXPRESSION)},
            {"role": "tool", "content": EXAMPLE_RESULT},
            {"role": "assistant", "content": EXAMPLE_RESULT}]


def to_tool_row(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    out["prompt"] = [{"role": "system", "content": SYSTEM_PROMPT}, *example_turns(), *row["prompt"]]
    out["agent_name"] = "tool_agent"
    return out


def tool_task_spec(kwargs: dict[str, Any]) -> ArithSpec:
    return ArithSpec(**{**TOOL_TASK_DEFAULTS, **kwargs})


def generate_tool_task(spec: ArithSpec) -> dict[str, list[dict[str, Any]]]:
    return {split: [to_tool_row(r) for r in rows] for split, rows in generate_arith(spec).items()}
