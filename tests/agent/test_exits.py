"""User code of an agent loop that tries to end the process: ``os._exit(0)`` in a tool (plain or ``async``), an
interaction or a user's agent loop stops the rollout with an error naming the row, the loop and the function (the
run ends non-zero); ``SystemExit`` / ``KeyboardInterrupt`` raised by a tool fail that call only, and the calls
after it still run (``npu_rl/agent/user_code.py``).

Before (issue 39): ``os._exit(0)`` ended the trainer with status 0 at the first tool call, nothing printed; an
``async`` tool raising ``SystemExit`` stopped the tools' event-loop thread, so every later call timed out.

The ``os._exit`` cases run in a child process: if the guard failed, ``os._exit(0)`` would end pytest itself, with
status 0."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap

import pytest

from npu_rl.agent.loops import AgentSample, ToolAgentLoop
from npu_rl.agent.tools.base import BaseTool, FunctionSchema, ToolResponse
from tests.agent.helpers import ScriptedServer, context

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EXITING = textwrap.dedent('''
    import os
    from npu_rl.agent.interactions import BaseInteraction
    from npu_rl.agent.loops import AgentLoopBase
    from npu_rl.agent.tools.base import BaseTool, FunctionSchema


    class PlainQuit(BaseTool):
        @classmethod
        def default_schema(cls):
            return FunctionSchema("plain_quit")

        def execute(self, instance_id, parameters, **kwargs):
            os._exit(0)


    class AsyncQuit(BaseTool):
        @classmethod
        def default_schema(cls):
            return FunctionSchema("async_quit")

        async def execute(self, instance_id, parameters, **kwargs):
            os._exit(0)


    class QuittingJudge(BaseInteraction):
        default_name = "quitting_judge"

        async def generate_response(self, instance_id, messages, **kwargs):
            os._exit(0)


    class QuittingLoop(AgentLoopBase):
        async def run(self, sample):
            os._exit(0)
''')

ROLLOUT = textwrap.dedent('''
    import sys
    from npu_rl.agent.loops import register_agent_loops_file
    from npu_rl.agent.runner import run_agent_loops
    from tests.agent.helpers import context
    from tests.agent.test_runner import prompt_batch, scripted_batch_generate
    from tests.helpers import make_tiny_tokenizer
    sys.path.insert(0, sys.argv[1])
    import exiting

    case = sys.argv[2]
    tok = make_tiny_tokenizer()
    generate, _ = scripted_batch_generate(tok, {"a": [f'<tool_call>{{"name": "{case}", "arguments": {{}}}}</tool_call>',
                                                      "done"], "b": ["fine", "done"]})
    batch = prompt_batch(tok, ["b", "a"], [None, "quitter" if case == "loop" else None])
    tools = {t.name: t for t in (exiting.PlainQuit(), exiting.AsyncQuit())}
    judge = exiting.QuittingJudge()
    if case == "interaction":
        batch.non_tensors["extra_info"] = [{}, {"interaction_kwargs": {"name": judge.name}}]
    register_agent_loops_file(sys.argv[3])
    try:
        run_agent_loops(batch, context(tok, None, tools=tools, interactions={judge.name: judge},
                                       default_agent_loop="tool_agent"), generate, 1, 0, 300, False)
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}")
        sys.exit(1)
    print("finished")
''')


@pytest.mark.parametrize("case, words", [
    ("plain_quit", "row 1: agent loop 'tool_agent': PlainQuit.execute called os._exit(0), which would have ended "
                   "the trainer"),
    ("async_quit", "row 1: agent loop 'tool_agent': AsyncQuit.execute called os._exit(0)"),
    ("interaction", "row 1: agent loop 'tool_agent': QuittingJudge.generate_response called os._exit(0)"),
    ("loop", "row 1: agent loop 'quitter' called os._exit(0), which would have ended the trainer"),
])
def test_os_exit_in_agent_code_stops_the_rollout_named_not_the_process(tmp_path, case, words):
    (tmp_path / "exiting.py").write_text(EXITING)
    (tmp_path / "loops.yaml").write_text(f"- {{name: quitter, _target_: {tmp_path}/exiting.py:QuittingLoop}}\n")
    result = subprocess.run([sys.executable, "-c", ROLLOUT, str(tmp_path), case, str(tmp_path / "loops.yaml")],
                            capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                            env={**os.environ, "PYTHONPATH": REPO_ROOT})
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr[-2000:])
    assert f"AgentExitError: {words}" in result.stdout, result.stdout


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
