"""``SystemExit`` / ``KeyboardInterrupt`` raised by a tool fail that call only, and the calls after it still run
(``npu_rl/agent/user_code.py``; ``os._exit`` in agent code: tests/e2e/test_agent_exits.py).

Before (issue 39): an ``async`` tool raising ``SystemExit`` stopped the tools' event-loop thread, so every later call
timed out."""

from __future__ import annotations

import asyncio

import pytest

from npu_rl.agent.loops import AgentSample, ToolAgentLoop
from npu_rl.agent.tools.base import BaseTool, FunctionSchema, ToolResponse
from tests.agent.helpers import ScriptedServer, context


class Raises(BaseTool):
    def __init__(self, name, exc):
        super().__init__({}, FunctionSchema(name))
        self.exc = exc

    def execute(self, instance_id, parameters, **kwargs):  # a plain def: runs in a thread of its own
        raise self.exc


class AsyncRaises(BaseTool):
    def __init__(self, name, exc):
        super().__init__({}, FunctionSchema(name))
        self.exc = exc

    async def execute(self, instance_id, parameters, **kwargs):
        raise self.exc


class Echo(BaseTool):
    @classmethod
    def default_schema(cls):
        return FunctionSchema("echo")

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse("echoed"), None, {}


def call(name):
    return f'<tool_call>{{"name": "{name}", "arguments": {{}}}}</tool_call>'


@pytest.mark.parametrize("tool, words", [
    (AsyncRaises("async_system_exit", SystemExit(3)), "AsyncRaises.execute raised SystemExit(3)"),
    (AsyncRaises("async_interrupt", KeyboardInterrupt()), "AsyncRaises.execute raised KeyboardInterrupt itself"),
    (Raises("plain_system_exit", SystemExit(0)), "Raises.execute raised SystemExit(0)"),
    (Raises("plain_interrupt", KeyboardInterrupt()), "Raises.execute raised KeyboardInterrupt itself"),
])
def test_system_exit_or_interrupt_in_a_tool_fails_that_call_only(tiny_tokenizer, tool, words):
    tok = tiny_tokenizer
    server = ScriptedServer(tok, {"go": [call(tool.name), call("echo"), "done"]})
    tools = {tool.name: tool, "echo": Echo()}
    out = asyncio.run(ToolAgentLoop(context(tok, server, tools=tools, response_length=900)).run(
        AgentSample([], [{"role": "user", "content": "go"}])))
    text = tok.decode(out.prompt_ids + out.response_ids)
    assert out.num_tool_calls == 2 and out.num_tool_errors == 1 and out.num_tool_timeouts == 0
    assert f"Error: {tool.name} failed: UserCodeError: {words}" in text
    assert "echoed" in text and text.endswith("done<|im_end|>")  # the next call ran: the tool loop is alive
