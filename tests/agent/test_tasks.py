"""The built-in calculator task and the shipped tool files."""

from __future__ import annotations

import json

from npu_rl.data.tool_task import TOOL_TASK_DEFAULTS, generate_tool_task, tool_task_spec
from npu_rl.agent.tool_parser import parse_hermes
from npu_rl.agent.tools.config import load_tools
from npu_rl.data.builtin import resolve_builtin
from npu_rl.data.io import read_rows


def test_rows_carry_the_example_and_the_agent_name():
    spec = tool_task_spec({"num_train": 20, "num_test": 5})
    splits = generate_tool_task(spec)
    row = splits["train"][0]
    assert row["agent_name"] == "tool_agent" and row["data_source"] == "arith"
    roles = [m["role"] for m in row["prompt"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    _, calls = parse_hermes(row["prompt"][2]["content"])  # the worked example parses as a call
    assert calls[0].name == "calculator" and calls[0].error is None
    a, b = row["extra_info"]["expression"].split(" * ")
    assert len(a) == len(b) == 3 and int(row["reward_model"]["ground_truth"]) == int(a) * int(b)
    test_questions = {r["prompt"][-1]["content"] for r in splits["test"]}
    assert not test_questions & {r["prompt"][-1]["content"] for r in splits["train"]}


def test_builtin_uri_and_tool_files(tmp_path, monkeypatch):
    monkeypatch.setenv("NPU_RL_CACHE", str(tmp_path))
    rows = list(read_rows(resolve_builtin("builtin://arith_tool/test?num_test=4&num_train=8")))
    assert len(rows) == 4 and rows[0]["agent_name"] == "tool_agent"
    assert json.loads(json.dumps(rows[0]["prompt"]))[0]["role"] == "system"
    assert TOOL_TASK_DEFAULTS["operators"] == "*"
    assert list(load_tools("builtin://calculator")) == ["calculator"]
    assert list(load_tools("builtin://gsm8k")) == ["calc_gsm8k_reward"]
