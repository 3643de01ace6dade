"""The agent-loop rollout a worker holds: built once from ``actor_rollout_ref.rollout`` (tools, interactions and
custom loops are loaded here, so a bad file fails at start-up), then called per batch with the worker's engine."""

from __future__ import annotations

from typing import Any, Sequence

from npu_rl.agent.interactions import load_interactions
from npu_rl.agent.loops import AgentContext, AgentSettings, register_agent_loops_file, resolve_agent_loop
from npu_rl.agent.runner import run_agent_loops
from npu_rl.agent.tools.config import load_tools
from npu_rl.protocol import Batch
from npu_rl.rollout.base import SamplingParams
from npu_rl.rollout.turns import generate_token_lists
from npu_rl.rollout.utils import cfg_get, to_plain


def agent_rollout_enabled(rollout_config: Any) -> bool:
    """``rollout.mode=async`` or ``rollout.multi_turn.enable`` routes generation through agent loops."""
    multi_turn = cfg_get(rollout_config, "multi_turn")
    return str(cfg_get(rollout_config, "mode", "sync")) == "async" or \
        bool(multi_turn is not None and cfg_get(multi_turn, "enable", False))


def settings_from_config(rollout_config: Any, response_length: int) -> AgentSettings:
    mt = cfg_get(rollout_config, "multi_turn") or {}
    agent = cfg_get(rollout_config, "agent") or {}
    optional = lambda v: None if v in (None, 0) else int(v)  # noqa: E731 - verl: null / 0 means no limit
    return AgentSettings(
        response_length=int(response_length),
        default_agent_loop=str(cfg_get(agent, "default_agent_loop", "single_turn_agent")),
        max_assistant_turns=optional(cfg_get(mt, "max_assistant_turns")),
        max_user_turns=optional(cfg_get(mt, "max_user_turns")),
        max_parallel_calls=int(cfg_get(mt, "max_parallel_calls", 1)),
        max_tool_response_length=int(cfg_get(mt, "max_tool_response_length", 256)),
        tool_response_truncate_side=str(cfg_get(mt, "tool_response_truncate_side", "middle")),
        format=str(cfg_get(mt, "format", "hermes")),
    )


class AgentRollout:
    def __init__(self, rollout_config: Any, tokenizer, stop_ids: Sequence[int], response_length: int,
                 chat_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.settings = settings_from_config(rollout_config, response_length)
        mt = cfg_get(rollout_config, "multi_turn") or {}
        agent = cfg_get(rollout_config, "agent") or {}
        loops_file = cfg_get(agent, "agent_loop_config_path")
        if loops_file:
            register_agent_loops_file(loops_file)
        resolve_agent_loop(self.settings.default_agent_loop)  # an unknown default fails now
        tool_path, interaction_path = cfg_get(mt, "tool_config_path"), cfg_get(mt, "interaction_config_path")
        self.tools = load_tools(tool_path) if tool_path else {}
        self.interactions = load_interactions(interaction_path) if interaction_path else {}
        self.stop_ids = [int(i) for i in stop_ids]
        prompt_length = cfg_get(rollout_config, "prompt_length")
        self.max_prompt_length = int(prompt_length) if prompt_length is not None else None
        self.context = AgentContext(
            tokenizer=tokenizer, server=None, settings=self.settings, stop_ids=self.stop_ids,  # type: ignore
            stop_texts=[tokenizer.decode([i]) for i in self.stop_ids], tools=self.tools,
            interactions=self.interactions, chat_kwargs=dict(to_plain(chat_kwargs or {}) or {}))

    def generate(self, engine, prompts: Batch, sampling: SamplingParams) -> Batch:
        pad = int(self.tokenizer.pad_token_id)

        limit = None if self.max_prompt_length is None else self.max_prompt_length + sampling.max_new_tokens

        def batch_generate(token_lists, budgets):
            if limit is not None:  # the engine's max_model_len is prompt_length + response_length
                for ids, budget in zip(token_lists, budgets):
                    if len(ids) + budget > limit:
                        raise ValueError(
                            f"an agent conversation needs {len(ids) + budget} tokens (its prompt, with the tool "
                            f"schemas rendered, is longer than data.max_prompt_length={self.max_prompt_length}); "
                            "raise data.max_prompt_length")
            return generate_token_lists(engine, token_lists, budgets, sampling, pad)

        out = run_agent_loops(prompts, self.context, batch_generate, sampling.n, pad, sampling.max_new_tokens,
                              sampling.return_logprobs)
        device = prompts["input_ids"].device
        return out.to(device) if device.type != "cpu" else out
