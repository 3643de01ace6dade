"""Start-up checks for agent-loop rollouts: the config (called from ``npu_rl.trainer.preflight``) and the data rows
(``agent_row_problems``, called once the data set is read, before any model loads): every problem as a message
naming the key and, for files, the file (and the row)."""

from __future__ import annotations

from typing import Any, Iterable, Optional

from npu_rl.agent.interactions import load_interactions
from npu_rl.agent.loops import SINGLE_TURN_LOOP, register_agent_loops_file, resolve_agent_loop, row_agent_loop
from npu_rl.agent.rollout import agent_rollout_enabled
from npu_rl.agent.tool_parser import TOOL_PARSERS
from npu_rl.agent.tools.config import load_tools

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
    return problems


MAX_ROW_PROBLEMS = 10


def agent_row_problems(config: Any, rows: Iterable[tuple[Any, dict[str, Any]]]) -> list[str]:
    """What the data rows ask of the agent loops that the config does not offer. ``rows``: (where, row) pairs, where
    ``where`` names the file and row. A row's ``agent_name`` may only choose a registered loop by name (a data set is
    not code: a file path or module name is refused), and its ``extra_info.interaction_kwargs.name`` an interaction
    of ``multi_turn.interaction_config_path``. Call after ``agent_config_problems`` (which registers the config's
    loops)."""
    rollout = config.actor_rollout_ref.rollout

    if not agent_rollout_enabled(rollout):
        return []

    partial = config.async_training.mode == "fully_async" and bool(config.async_training.partial_rollout)

    if rollout.agent.agent_loop_config_path:  # what the config registers (again: idempotent)
        register_agent_loops_file(rollout.agent.agent_loop_config_path)
    resolve_agent_loop(rollout.agent.default_agent_loop)
    interactions = _interaction_names(rollout.multi_turn.interaction_config_path)
    problems: list[str] = []
    for where, row in rows:
        if len(problems) >= MAX_ROW_PROBLEMS:
            problems.append(f"... (stopped after {MAX_ROW_PROBLEMS} rows)")
            break
        name = row.get("agent_name")
        if name is not None and not (isinstance(name, float) and name != name):  # None / NaN: the default loop
            try:
                row_agent_loop(name, str(where))
            except ValueError as exc:
                problems.append(str(exc))
            else:
                if partial and name != SINGLE_TURN_LOOP:
                    problems.append(f"{where}: agent_name={name!r} with async_training.partial_rollout=True: only "
                                    f"single-turn rows ({SINGLE_TURN_LOOP}) can be interrupted at a weight push; set "
                                    "async_training.partial_rollout=False")
        extra = row.get("extra_info")
        kwargs = extra.get("interaction_kwargs") if isinstance(extra, dict) else None
        if not kwargs:
            continue
        if interactions is None:
            problems.append(f"{where}: extra_info.interaction_kwargs is set but actor_rollout_ref.rollout.multi_turn."
                            "interaction_config_path is not")
            continue
        chosen = kwargs.get("name") if isinstance(kwargs, dict) else None
        if not isinstance(kwargs, dict) or (chosen is None and len(interactions) != 1) or \
                (chosen is not None and chosen not in interactions):
            problems.append(f"{where}: extra_info.interaction_kwargs.name={chosen!r} is not an interaction of "
                            f"multi_turn.interaction_config_path; known: {', '.join(sorted(interactions))}")
    return problems


def _interaction_names(path: Any) -> Optional[set[str]]:
    if not path:
        return None

    return set(load_interactions(path))
