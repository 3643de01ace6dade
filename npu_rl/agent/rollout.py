"""The agent-loop rollout a worker holds: built once from ``actor_rollout_ref.rollout`` (tools, interactions and
custom loops are loaded here, so a bad file fails at start-up), then called per batch with the worker's engine."""

from __future__ import annotations

from typing import Any, Sequence

from npu_rl.agent.interactions import load_interactions
from npu_rl.agent.loops import AgentContext, AgentSettings, register_agent_loops_file, resolve_agent_loop
from npu_rl.agent.runner import run_agent_loops
from npu_rl.agent.tools.config import load_tools
from npu_rl.protocol import Batch
from npu_rl.rollout.base import Generation, RolloutEngine, SamplingParams


def agent_rollout_enabled(rollout_cfg: Any) -> bool:
    """``rollout.mode=async`` or ``rollout.multi_turn.enable`` routes generation through agent loops."""
    return rollout_cfg.mode == "async" or bool(rollout_cfg.multi_turn.enable)


def settings_from_config(rollout_cfg: Any, response_length: int) -> AgentSettings:
    mt, agent = rollout_cfg.multi_turn, rollout_cfg.agent
    optional = lambda v: None if v in (None, 0) else int(v)  # noqa: E731 - verl: null / 0 means no limit
    return AgentSettings(
        response_length=int(response_length),
        default_agent_loop=str(agent.default_agent_loop),
        max_assistant_turns=optional(mt.max_assistant_turns),
        max_user_turns=optional(mt.max_user_turns),
        max_parallel_calls=int(mt.max_parallel_calls),
        max_tool_response_length=int(mt.max_tool_response_length),
        tool_response_truncate_side=str(mt.tool_response_truncate_side),
        format=str(mt.format),
        sample_timeout_s=float(agent.sample_timeout_s),
    )


class AgentRollout:
    """``rollout_cfg``: the ``actor_rollout_ref.rollout`` slice (``RolloutConfig``); ``response_length``: the
    conversation's token budget after the prompt (``data.max_response_length``)."""

    def __init__(self, rollout_cfg: Any, tokenizer, stop_ids: Sequence[int], response_length: int,
                 chat_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.settings = settings_from_config(rollout_cfg, response_length)
        mt, agent = rollout_cfg.multi_turn, rollout_cfg.agent
        if agent.agent_loop_config_path:
            register_agent_loops_file(agent.agent_loop_config_path)
        resolve_agent_loop(self.settings.default_agent_loop)  # an unknown default fails now
        self.tools = load_tools(mt.tool_config_path) if mt.tool_config_path else {}
        self.interactions = load_interactions(mt.interaction_config_path) if mt.interaction_config_path else {}
        self.stop_ids = [int(i) for i in stop_ids]
        prompt_length = rollout_cfg.prompt_length
        self.max_prompt_length = int(prompt_length) if isinstance(prompt_length, int) else None
        self.context = AgentContext(
            tokenizer=tokenizer, server=None, settings=self.settings, stop_ids=self.stop_ids,  # type: ignore
            stop_texts=[tokenizer.decode([i]) for i in self.stop_ids], tools=self.tools,
            interactions=self.interactions, chat_kwargs=dict(chat_kwargs or {}))

    def generate(self, engine: RolloutEngine, prompts: Batch, sampling: SamplingParams) -> Generation:
        """The conversations' batch, with the agent metrics and the engine's (timings summed over its calls)."""
        engine_metrics: dict[str, float] = {}
        limit = None if self.max_prompt_length is None else self.max_prompt_length + sampling.max_new_tokens

        def batch_generate(token_lists, budgets):
            if limit is not None:  # the engine's max_model_len is prompt_length + response_length
                for ids, budget in zip(token_lists, budgets):
                    if len(ids) + budget > limit:
                        raise ValueError(
                            f"an agent conversation needs {len(ids) + budget} tokens (its prompt, with the tool "
                            f"schemas rendered, is longer than data.max_prompt_length={self.max_prompt_length}); "
                            "raise data.max_prompt_length")
            turn = engine.generate_token_lists(token_lists, budgets, sampling)
            for key, value in turn.metrics.items():  # timings add up over the calls, other figures keep the largest
                engine_metrics[key] = (engine_metrics.get(key, 0.0) + value if key.startswith("timing_s/")
                                       else max(engine_metrics.get(key, value), value))
            return [(c.token_ids, c.logprobs) for c in turn.completions]

        try:
            out = run_agent_loops(prompts, self.context, batch_generate, sampling.n, int(self.tokenizer.pad_token_id),
                                  sampling.max_new_tokens, sampling.return_logprobs)
        finally:  # TP > 1: the group's other ranks may still have turns to generate, with this rank in the call
            finish = getattr(engine, "finish_token_lists", None)
            if finish is not None:
                finish(sampling)
        device = prompts["input_ids"].device
        batch = out.batch.to(device) if device.type != "cpu" else out.batch
        return Generation(batch, engine_metrics | out.metrics)
