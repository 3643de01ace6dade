"""rollout.mode / multi_turn / agent keys: accepted with verl's names, checked at start-up naming the file."""

from __future__ import annotations

import pytest

from npu_rl.config.loader import ConfigError
from npu_rl.trainer.preflight import load_checked

def load(*overrides):
    return load_checked(list(overrides), "quickstart", check_paths=True, check_device=False)


def test_verl_keys_and_async_mode_are_accepted(tmp_path):
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - class_name: npu_rl.agent.tools.calculator.CalculatorTool\n")
    config = load("actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.multi_turn.enable=True",
                  f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
                  "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
                  "actor_rollout_ref.rollout.multi_turn.max_user_turns=2",
                  "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=2",
                  "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=100",
                  "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=left",
                  "actor_rollout_ref.rollout.multi_turn.format=hermes",
                  "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
                  "actor_rollout_ref.rollout.agent.num_workers=4", "data.return_raw_chat=True")
    rollout = config.actor_rollout_ref.rollout
    assert rollout.mode == "async" and rollout.multi_turn.max_assistant_turns == 3
    assert rollout.agent.default_agent_loop == "tool_agent"


def test_defaults_match_verl():
    rollout = load().actor_rollout_ref.rollout
    mt = rollout.multi_turn
    assert (mt.enable, mt.max_assistant_turns, mt.max_user_turns, mt.max_parallel_calls,
            mt.max_tool_response_length, mt.tool_response_truncate_side, mt.format) == \
        (False, None, None, 1, 256, "middle", "hermes")
    assert (rollout.agent.default_agent_loop, rollout.agent.num_workers) == ("single_turn_agent", 8)


def test_problems_are_named(tmp_path):
    bad = tmp_path / "bad_tools.yaml"
    bad.write_text("tools:\n  - class_name: my_pkg.missing.Tool\n")
    with pytest.raises(ConfigError) as info:
        load("actor_rollout_ref.rollout.mode=async", f"actor_rollout_ref.rollout.multi_turn.tool_config_path={bad}",
             "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=top",
             "actor_rollout_ref.rollout.agent.default_agent_loop=my_agent")
    text = str(info.value)
    assert "bad_tools.yaml, tools[0]: cannot load class 'my_pkg.missing.Tool'" in text
    assert "tool_response_truncate_side='top'" in text
    assert "default_agent_loop: unknown agent loop 'my_agent'" in text
    assert "data.return_raw_chat=True" in text
    with pytest.raises(ConfigError, match="mode='server' is not one of sync, async"):
        load("actor_rollout_ref.rollout.mode=server")
    with pytest.raises(ConfigError, match="agent loops are off"):
        load(f"actor_rollout_ref.rollout.multi_turn.tool_config_path={bad}")
