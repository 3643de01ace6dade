"""Conversations built by hand: exactly which tokens are trained (mask 1) and which are context only (mask 0)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from npu_rl.agent.interactions import AnswerCheckInteraction
from npu_rl.agent.loops import AgentSample, SingleTurnAgentLoop, ToolAgentLoop
from npu_rl.agent.runner import assemble_agent_batch
from npu_rl.agent.tools.calculator import CalculatorTool
from npu_rl.protocol import Batch
from tests.agent.helpers import ScriptedServer, context

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>'


def run(loop_cls, ctx, messages, prompt_ids=None, extra_info=None):
    return asyncio.run(loop_cls(ctx).run(AgentSample(prompt_ids or [], messages, extra_info or {})))


def split(tok, out):
    trained = tok.decode([t for t, m in zip(out.response_ids, out.response_mask) if m])
    context_only = tok.decode([t for t, m in zip(out.response_ids, out.response_mask) if not m])
    return trained, context_only


def test_tool_turn_is_context_and_model_turns_are_trained(tiny_tokenizer):
    tok = tiny_tokenizer
    server = ScriptedServer(tok, {"12*34": [CALL, "The answer is 408."]})
    out = run(ToolAgentLoop, context(tok, server, tools={"calculator": CalculatorTool()}),
              [{"role": "user", "content": "What is 12*34?"}])
    text = tok.decode(out.response_ids)
    assert text == (f"{CALL}<|im_end|>\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"
                    "The answer is 408.<|im_end|>")
    trained, context_only = split(tok, out)
    assert trained == f"{CALL}<|im_end|>The answer is 408.<|im_end|>"
    assert context_only == "\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"
    # the mask is one run of 1s, one run of 0s, one run of 1s, at the exact boundaries
    first = len(tok.encode(CALL, add_special_tokens=False)) + 1
    hole = len(tok.encode("\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False))
    last = len(tok.encode("The answer is 408.", add_special_tokens=False)) + 1
    assert out.response_mask == [1] * first + [0] * hole + [1] * last
    assert out.logprobs == [-0.5] * first + [0.0] * hole + [-0.5] * last
    assert (out.num_turns, out.num_tool_calls, out.turn_lengths) == (4, 1, [first, last])
    # the second request saw the whole conversation so far: prompt + model turn + tool turn
    assert server.requests[1][0] == out.prompt_ids + out.response_ids[: first + hole]


def test_prompt_renders_the_tools_when_the_template_ignores_them(tiny_tokenizer):
    tok = tiny_tokenizer
    server = ScriptedServer(tok, {"hi": ["hello"]})
    out = run(ToolAgentLoop, context(tok, server, tools={"calculator": CalculatorTool()}),
              [{"role": "user", "content": "hi"}])
    prompt = tok.decode(out.prompt_ids)
    assert prompt.startswith("<|im_start|>system\n# Tools") and '"name": "calculator"' in prompt
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert out.response_mask == [1] * len(out.response_ids) and out.num_turns == 2


def test_single_turn_uses_the_dataset_prompt_ids(tiny_tokenizer):
    tok = tiny_tokenizer
    ids = tok.encode("<|im_start|>user\nsay hi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    out = run(SingleTurnAgentLoop, context(tok, ScriptedServer(tok, {"say hi": ["hi"]})), None, prompt_ids=ids)
    assert out.prompt_ids == ids and tok.decode(out.response_ids) == "hi<|im_end|>"
    assert out.response_mask == [1, 1, 1]


def test_interaction_user_turns_are_not_trained(tiny_tokenizer):
    tok = tiny_tokenizer
    server = ScriptedServer(tok, {"2+2": ["#### 5", "#### 4"]})
    interaction = AnswerCheckInteraction({"name": "gsm8k"})
    out = run(ToolAgentLoop, context(tok, server, interactions={"gsm8k": interaction}),
              [{"role": "user", "content": "2+2?"}],
              extra_info={"interaction_kwargs": {"name": "gsm8k", "ground_truth": "4"}})
    trained, context_only = split(tok, out)
    assert trained == "#### 5<|im_end|>#### 4<|im_end|>"
    assert context_only == ("\n<|im_start|>user\nYour response is incorrect! You need to reflect on your answer and "
                            "try again.<|im_end|>\n<|im_start|>assistant\n")
    assert out.turn_scores == [0.0, 1.0] and out.num_turns == 4


def test_turn_limits_and_response_length(tiny_tokenizer):
    tok = tiny_tokenizer
    tools = {"calculator": CalculatorTool()}
    server = ScriptedServer(tok, {"12*34": [CALL] * 5})
    out = run(ToolAgentLoop, context(tok, server, tools=tools, max_assistant_turns=2),
              [{"role": "user", "content": "12*34"}])
    assert len(out.turn_lengths) == 2 and out.num_tool_calls == 1
    server = ScriptedServer(tok, {"12*34": [CALL] * 5})
    out = run(ToolAgentLoop, context(tok, server, tools=tools, response_length=100),
              [{"role": "user", "content": "12*34"}])
    assert len(out.response_ids) <= 100 and len(out.turn_lengths) == 1  # no room for the tool reply + a turn
    server = ScriptedServer(tok, {"12*34": [CALL] * 5})
    out = run(ToolAgentLoop, context(tok, server, tools=tools, response_length=20),
              [{"role": "user", "content": "12*34"}])
    assert len(out.response_ids) == 20 and out.num_tool_calls == 0  # cut mid-call: not executed


def test_assembled_batch_attends_to_tool_tokens_but_trains_only_model_tokens(tiny_tokenizer):
    tok = tiny_tokenizer
    tools = {"calculator": CalculatorTool()}
    outs = [run(ToolAgentLoop, context(tok, ScriptedServer(tok, {"12*34": [CALL, "408"]}), tools=tools),
                [{"role": "user", "content": "12*34"}]),
            run(ToolAgentLoop, context(tok, ScriptedServer(tok, {"hi": ["yo"]}), tools=tools),
                [{"role": "user", "content": "hi"}])]
    rows = Batch({"input_ids": torch.zeros(2, 3, dtype=torch.long), "attention_mask": torch.ones(2, 3)},
                 {"uid": ["a", "b"]})
    batch = assemble_agent_batch(rows, outs, pad_token_id=0, response_length=160, return_logprobs=True)
    width = max(len(o.prompt_ids) for o in outs)
    assert batch["prompts"].shape == (2, width) and batch["responses"].shape == (2, 160)
    for i, o in enumerate(outs):
        n = len(o.response_ids)
        assert batch["attention_mask"][i, width:].tolist() == [1] * n + [0] * (160 - n)
        assert batch["response_mask"][i].tolist() == o.response_mask + [0] * (160 - n)
        assert batch["attention_mask"][i, :width].sum() == len(o.prompt_ids)
        positions = batch["position_ids"][i][batch["attention_mask"][i].bool()]
        assert positions.tolist() == list(range(len(o.prompt_ids) + n))  # contiguous through the tool tokens
    assert (batch["rollout_logprobs"][batch["response_mask"] == 0] == 0).all()
    assert batch["__num_turns__"].tolist() == [4, 2] and list(batch["uid"]) == ["a", "b"]
