"""Agent loops: how one sample becomes a conversation. Registered by name; a row picks one with ``agent_name``
(default ``rollout.agent.default_agent_loop``).

- ``single_turn_agent``: one generation from the data set's prompt (what the sync rollout does).
- ``tool_agent``: generate; parse tool calls (``multi_turn.format``); run them (at most ``max_parallel_calls`` per
  turn, each cut at its tool's timeout); append their outputs as tool messages; generate again ... until the model
  answers without a call, a turn limit (``max_assistant_turns`` / ``max_user_turns``) or the response length is
  reached. With an interaction (the row's ``extra_info.interaction_kwargs.name``) a turn without tool calls gets the
  interaction's user reply instead of ending the conversation, until it says stop.

A user's loop: subclass :class:`AgentLoopBase` and name it in the config, never in the data: as
``rollout.agent.default_agent_loop`` (``path/to/file.py:MyLoop`` or ``pkg.mod:MyLoop``), or as ``{name, _target_}``
entries of ``rollout.agent.agent_loop_config_path`` (verl's file). A row's ``agent_name`` only chooses among the
loops so registered, by name: a data set is not code, so a row naming a file or a module is refused (at start-up,
naming the file and row; :func:`row_agent_loop` refuses it again where the loop is picked). Only the name travels
between processes: every worker loads the class itself, so nothing user-defined is pickled (works the same under
Ray).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, Sequence

from npu_rl.agent.conversation import Conversation, truncate_text
from npu_rl.agent.interactions import BaseInteraction
from npu_rl.agent.tool_parser import TOOL_PARSERS, ToolCall
from npu_rl.agent.tools.base import BaseTool, ToolResponse
from npu_rl.agent.user_code import UserCodeTimeout, call_user_code
from npu_rl.utils.registry import Registry
from npu_rl.agent.tools.config import ToolConfigError, load_class

SINGLE_TURN_LOOP = "single_turn_agent"  # one generation from the prompt: what a plain (sync-mode) rollout does


logger = logging.getLogger(__name__)


class AgentSampleError(Exception):
    """One sample's conversation could not be finished (its message names the row and what failed); the runner
    counts it as a failed sample."""


@dataclass
class TokenOutput:
    token_ids: list[int]
    logprobs: Optional[list[float]] = None


class GenerationServer(Protocol):
    async def generate(self, prompt_ids: list[int], max_tokens: int) -> TokenOutput:
        """Sample one continuation of ``prompt_ids`` (at most ``max_tokens`` tokens, ending at a stop id)."""


@dataclass
class AgentSettings:
    """``rollout.multi_turn`` / ``rollout.agent`` (verl's names) plus the response budget."""

    response_length: int
    default_agent_loop: str = SINGLE_TURN_LOOP
    max_assistant_turns: Optional[int] = None
    max_user_turns: Optional[int] = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    format: str = "hermes"
    sample_timeout_s: float = 3600.0


@dataclass
class AgentContext:
    tokenizer: Any
    server: GenerationServer
    settings: AgentSettings
    stop_ids: Sequence[int]
    stop_texts: Sequence[str] = ()
    tools: dict[str, BaseTool] = field(default_factory=dict)
    interactions: dict[str, BaseInteraction] = field(default_factory=dict)
    chat_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class AgentSample:
    prompt_ids: list[int]  # the data set's rendering of the prompt
    messages: Optional[list[dict[str, Any]]]  # raw_prompt (data.return_raw_chat=True), or None
    extra_info: dict[str, Any] = field(default_factory=dict)
    row: int = 0  # the row's index in the rollout batch (for error messages)


@dataclass
class AgentOutput:
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    logprobs: list[float]
    num_turns: int  # verl's count: user turns + assistant turns + 1 (the prompt)
    turn_lengths: list[int] = field(default_factory=list)
    num_tool_calls: int = 0
    num_tool_errors: int = 0  # malformed calls, unknown tools, bad arguments, tools that raised
    num_tool_timeouts: int = 0
    tool_rewards: list[float] = field(default_factory=list)
    turn_scores: list[float] = field(default_factory=list)
    generate_s: float = 0.0
    tool_s: float = 0.0
    failed: Optional[str] = None  # set: the loop raised or returned garbage; this sample has an empty response

    @classmethod
    def of(cls, conv: Conversation, num_turns: int, **kwargs: Any) -> AgentOutput:
        return cls(conv.prompt_ids, conv.response_ids, conv.response_mask, conv.logprobs, num_turns,
                   list(conv.turn_lengths), **kwargs)


class AgentLoopBase:
    def __init__(self, context: AgentContext):
        self.ctx = context

    async def run(self, sample: AgentSample) -> AgentOutput:
        raise NotImplementedError(f"{type(self).__name__}.run")

    async def generate_turn(self, conv: Conversation) -> tuple[str, float]:
        """One model turn appended to ``conv``: (its text, seconds spent)."""
        budget = self.ctx.settings.response_length - len(conv.response_ids)
        start = time.perf_counter()
        out = await self.ctx.server.generate(conv.context_ids(), budget)
        ids = out.token_ids[:budget]
        logprobs = out.logprobs[:budget] if out.logprobs is not None else None
        return conv.add_generated(ids, logprobs, self.ctx.stop_ids), time.perf_counter() - start


AGENT_LOOPS: Registry[type] = Registry("agent loop", "agent_name / actor_rollout_ref.rollout.agent.default_agent_loop")


def resolve_agent_loop(name: str) -> type:
    cls = AGENT_LOOPS.get(str(name))
    if not (isinstance(cls, type) and issubclass(cls, AgentLoopBase)):
        raise ValueError(f"agent loop {name!r} is {cls!r}, not a subclass of npu_rl.agent.loops.AgentLoopBase")
    return cls


def row_agent_loop(name: Any, where: str = "") -> type:
    """The loop a data row asks for: a name already registered (built in, the config's default, or an entry of
    ``agent_loop_config_path``); never a plug-in path, which would let data choose code to import."""
    prefix = f"{where}: " if where else ""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{prefix}agent_name must be a non-empty string naming a registered agent loop, got {name!r}")
    if name not in AGENT_LOOPS:
        raise ValueError(f"{prefix}agent_name {name!r} is not a registered agent loop; known: "
                         f"{', '.join(AGENT_LOOPS.names())}. A data row may not name a file or module to load: put "
                         "the loop in the config (rollout.agent.agent_loop_config_path or default_agent_loop) and "
                         "give the row its name")
    return resolve_agent_loop(name)


def register_agent_loops_file(path: str) -> list[str]:
    """verl's ``agent_loop_config_path``: a YAML list of ``{name, _target_}``; returns the names registered."""
    import os

    import yaml

    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        raise ToolConfigError(f"rollout.agent.agent_loop_config_path {full}: no such file")
    with open(full, encoding="utf-8") as f:
        entries = yaml.safe_load(f)
    if not isinstance(entries, list):
        raise ToolConfigError(f"rollout.agent.agent_loop_config_path {full}: expected a list of {{name, _target_}}")
    names = []
    for i, entry in enumerate(entries):
        where = f"{full}, entry {i}"
        if not isinstance(entry, dict) or not entry.get("name") or not entry.get("_target_"):
            raise ToolConfigError(f"{where}: expected a mapping with name and _target_")
        cls = load_class(entry["_target_"], AgentLoopBase, where)
        if entry["name"] not in AGENT_LOOPS:
            AGENT_LOOPS.register(entry["name"])(cls)
        names.append(entry["name"])
    return names


@AGENT_LOOPS.register(SINGLE_TURN_LOOP)
class SingleTurnAgentLoop(AgentLoopBase):
    async def run(self, sample: AgentSample) -> AgentOutput:
        conv = Conversation(self.ctx.tokenizer, list(sample.messages or []), stop_texts=self.ctx.stop_texts,
                            chat_kwargs=self.ctx.chat_kwargs)
        conv.start(sample.prompt_ids)
        _, seconds = await self.generate_turn(conv)
        return AgentOutput.of(conv, num_turns=2, generate_s=seconds)


def tool_message(text: str) -> dict[str, Any]:
    return {"role": "tool", "content": text}


@AGENT_LOOPS.register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    async def run(self, sample: AgentSample) -> AgentOutput:
        ctx, s = self.ctx, self.ctx.settings
        if sample.messages is None:
            raise ValueError(f"tool_agent (row {sample.row}): the row has no raw_prompt; set "
                             "data.return_raw_chat=True (the agent renders the prompt with the tools itself)")
        schemas = [tool.tool_schema.to_openai() for tool in ctx.tools.values()]
        conv = Conversation(ctx.tokenizer, [dict(m) for m in sample.messages], schemas, ctx.stop_texts,
                            ctx.chat_kwargs)
        conv.start()
        parse = TOOL_PARSERS.get(s.format)
        out = dict(num_tool_calls=0, num_tool_errors=0, num_tool_timeouts=0, generate_s=0.0, tool_s=0.0)
        tool_rewards: list[float] = []
        turn_scores: list[float] = []
        instances: dict[str, str] = {}
        tools_kwargs = dict(sample.extra_info.get("tools_kwargs") or {})
        interaction, interaction_id = await self._start_interaction(sample)
        assistant_turns = user_turns = 0
        try:
            while len(conv.response_ids) < s.response_length:
                text, seconds = await self.generate_turn(conv)
                out["generate_s"] += seconds
                assistant_turns += 1
                if len(conv.response_ids) >= s.response_length or not conv.ended_with_stop:
                    break
                if (s.max_assistant_turns and assistant_turns >= s.max_assistant_turns) or \
                        (s.max_user_turns and user_turns >= s.max_user_turns):
                    break
                _, calls = parse(text) if ctx.tools else (text, [])
                if calls:
                    start = time.perf_counter()
                    calls = calls[: max(1, s.max_parallel_calls)]
                    results = await asyncio.gather(*(self._call(c, instances, tools_kwargs, out) for c in calls))
                    out["tool_s"] += time.perf_counter() - start
                    messages = []
                    for text_out, reward in results:
                        messages.append(tool_message(truncate_text(text_out, s.max_tool_response_length,
                                                                   s.tool_response_truncate_side)))
                        if reward is not None:
                            tool_rewards.append(float(reward))
                elif interaction is not None:
                    done, reply, score = await self._interaction_turn(interaction, interaction_id, conv, sample)
                    turn_scores.append(score)
                    if done:
                        break
                    messages = [{"role": "user", "content": reply}]
                else:
                    break
                if len(conv.response_ids) + len(conv.message_tokens(messages)) >= s.response_length:
                    break  # no room for the reply and another turn (verl stops here too)
                conv.add_messages(messages)
                user_turns += 1
        finally:
            for name, instance_id in instances.items():
                tool = ctx.tools[name]
                try:
                    await call_user_code(tool.release, instance_id, timeout_s=tool.timeout_s)
                except Exception as exc:  # noqa: BLE001 - the conversation is done; a failed release is only logged
                    logger.warning("row %s: tool %s: release failed: %s: %s", sample.row, name,
                                   type(exc).__name__, exc)
            if interaction is not None:
                try:
                    await call_user_code(interaction.finalize_interaction, interaction_id,
                                         timeout_s=interaction.timeout_s)
                except Exception as exc:  # noqa: BLE001
                    logger.warning("row %s: interaction %s: finalize_interaction failed: %s: %s", sample.row,
                                   interaction.name, type(exc).__name__, exc)
        return AgentOutput.of(conv, num_turns=user_turns + assistant_turns + 1, tool_rewards=tool_rewards,
                              turn_scores=turn_scores, **out)

    async def _start_interaction(self, sample: AgentSample):
        kwargs = dict(sample.extra_info.get("interaction_kwargs") or {})
        if not kwargs:
            return None, None
        name = kwargs.pop("name", None)
        if name is None and len(self.ctx.interactions) == 1:
            name = next(iter(self.ctx.interactions))
        if name not in self.ctx.interactions:
            raise AgentSampleError(f"row {sample.row}: interaction {name!r} (extra_info.interaction_kwargs.name) is "
                                   f"not in multi_turn.interaction_config_path; known: {sorted(self.ctx.interactions)}")
        interaction = self.ctx.interactions[name]
        try:
            instance_id = await call_user_code(interaction.start_interaction, uuid.uuid4().hex,
                                               timeout_s=interaction.timeout_s, **kwargs)
        except Exception as exc:  # noqa: BLE001 - becomes this sample's failure, named
            raise AgentSampleError(f"row {sample.row}: interaction {name!r}: start_interaction failed: "
                                   f"{type(exc).__name__}: {exc}") from exc
        return interaction, instance_id

    async def _interaction_turn(self, interaction: BaseInteraction, instance_id: str, conv: Conversation,
                                sample: AgentSample) -> tuple[bool, str, float]:
        """The interaction's answer as (stop?, user text, turn score); anything else fails the sample, named."""
        where = f"row {sample.row}: interaction {interaction.name!r}"
        try:
            result = await call_user_code(interaction.generate_response, instance_id, conv.messages,
                                          timeout_s=interaction.timeout_s)
        except Exception as exc:  # noqa: BLE001
            raise AgentSampleError(f"{where}: generate_response failed: {type(exc).__name__}: {exc}") from exc
        if not (isinstance(result, (tuple, list)) and len(result) == 4):
            raise AgentSampleError(f"{where}: generate_response returned {result!r:.200}; expected a tuple "
                                   "(should_terminate, user_text, turn_score, metadata)")
        done, reply, score, _ = result
        try:
            score = float(score)
        except (TypeError, ValueError):
            score = math.nan
        if not math.isfinite(score) or not isinstance(reply, str):
            raise AgentSampleError(f"{where}: generate_response returned turn_score={result[2]!r:.50} and "
                                   f"user_text of type {type(reply).__name__}; expected a finite number and a string")
        return bool(done), reply, score

    async def _call(self, call: ToolCall, instances: dict[str, str], tools_kwargs: dict[str, Any],
                    counts: dict[str, Any]) -> tuple[str, Optional[float]]:
        """Run one call; every failure becomes an error text for the model (counted), never an exception."""
        counts["num_tool_calls"] += 1
        if call.error is not None:
            counts["num_tool_errors"] += 1
            return f"Error: {call.error}", None
        tool = self.ctx.tools.get(call.name)
        if tool is None:
            counts["num_tool_errors"] += 1
            return f"Error: there is no tool named {call.name!r}; available: {', '.join(self.ctx.tools)}", None
        missing = [p for p in tool.tool_schema.required() if p not in call.arguments]
        if missing:
            counts["num_tool_errors"] += 1
            return f"Error: {call.name} needs the argument(s) {', '.join(missing)}", None
        try:
            if call.name not in instances:
                create_kwargs = dict((tools_kwargs.get(call.name) or {}).get("create_kwargs") or {})
                instances[call.name] = await call_user_code(tool.create, uuid.uuid4().hex, timeout_s=tool.timeout_s,
                                                            **create_kwargs)
            response, reward, _ = await call_user_code(tool.execute, instances[call.name], call.arguments,
                                                       timeout_s=tool.timeout_s)
        except UserCodeTimeout:
            counts["num_tool_timeouts"] += 1
            return f"Error: {call.name} did not answer within {tool.timeout_s:g} s", None
        except Exception as exc:  # noqa: BLE001 - a tool's failure is the model's feedback, not a crash
            counts["num_tool_errors"] += 1
            return f"Error: {call.name} failed: {type(exc).__name__}: {exc}", None
        text = response.text if isinstance(response, ToolResponse) else str(response)
        if reward is not None:
            try:
                reward = float(reward)
            except (TypeError, ValueError):
                reward = math.nan
            if not math.isfinite(reward):
                counts["num_tool_errors"] += 1
                return f"Error: {call.name} failed: it returned a step reward that is not a finite number", None
        return text, reward
