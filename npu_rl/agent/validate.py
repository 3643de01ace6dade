"""Start-up checks for agent-loop rollouts (called from ``npu_rl.trainer.preflight``): every problem as a message
naming the key and, for files, the file."""

from __future__ import annotations

from typing import Any

ROLLOUT_MODES = ("sync", "async")
TRUNCATE_SIDES = ("left", "right", "middle")


def agent_config_problems(config: Any, check_paths: bool = True) -> list[str]:
    rollout = config.actor_rollout_ref.rollout
    key = "actor_rollout_ref.rollout"
    problems: list[str] = []
    if rollout.mode not in ROLLOUT_MODES:
        problems.append(f"{key}.mode={rollout.mode!r} is not one of {', '.join(ROLLOUT_MODES)}")
        return problems
    mt, agent = rollout.multi_turn, rollout.agent
    if mt.tool_response_truncate_side not in TRUNCATE_SIDES:
        problems.append(f"{key}.multi_turn.tool_response_truncate_side={mt.tool_response_truncate_side!r} is not one "
                        f"of {', '.join(TRUNCATE_SIDES)}")
    if mt.max_parallel_calls < 1:
        problems.append(f"{key}.multi_turn.max_parallel_calls={mt.max_parallel_calls} must be >= 1")
    if not (rollout.mode == "async" or mt.enable):
        if mt.tool_config_path or mt.interaction_config_path:
            problems.append(f"{key}.multi_turn.tool_config_path / interaction_config_path are set but agent loops "
                            f"are off: set {key}.mode=async or {key}.multi_turn.enable=True")
        return problems
    from npu_rl.agent.interactions import load_interactions
    from npu_rl.agent.loops import register_agent_loops_file, resolve_agent_loop
    from npu_rl.agent.tool_parser import TOOL_PARSERS
    from npu_rl.agent.tools.config import load_tools

    def attempt(fn, prefix=""):
        try:
            fn()
        except (ValueError, TypeError, ImportError, AttributeError, FileNotFoundError, OSError) as exc:
            problems.append(prefix + str(exc))

    attempt(lambda: TOOL_PARSERS.get(mt.format), f"{key}.multi_turn.format: ")
    if agent.agent_loop_config_path and check_paths:
        attempt(lambda: register_agent_loops_file(agent.agent_loop_config_path))
    attempt(lambda: resolve_agent_loop(agent.default_agent_loop), f"{key}.agent.default_agent_loop: ")
    if check_paths and mt.tool_config_path:
        attempt(lambda: load_tools(mt.tool_config_path))
    if check_paths and mt.interaction_config_path:
        attempt(lambda: load_interactions(mt.interaction_config_path))
    if (mt.tool_config_path or mt.interaction_config_path) and not config.data.return_raw_chat:
        problems.append("tools / interactions need the prompt as messages: set data.return_raw_chat=True (as verl's "
                        "multi-turn scripts do)")
    if rollout.name == "vllm" and int(rollout.tensor_model_parallel_size) > 1:
        problems.append(f"{key}.tensor_model_parallel_size={rollout.tensor_model_parallel_size}: agent-loop rollouts "
                        "run with tensor_model_parallel_size=1 only (for now)")
    return problems
