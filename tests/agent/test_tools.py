"""Tools: safe arithmetic, the GSM8K tool, verl's tool config file, the hermes parser, and failures as feedback."""

from __future__ import annotations

import asyncio
import importlib.util
import textwrap
import time

import pytest

from npu_rl.agent.loops import AgentSample, ToolAgentLoop
from npu_rl.agent.tool_parser import parse_hermes
from npu_rl.agent.tools.base import BaseTool, FunctionSchema, ToolResponse
from npu_rl.agent.tools.calculator import CalculatorError, CalculatorTool, safe_eval
from npu_rl.agent.tools.config import ToolConfigError, load_tools
from npu_rl.agent.tools.gsm8k import Gsm8kTool
from tests.agent.helpers import ScriptedServer, context


@pytest.mark.parametrize("expression, value", [("123 * 456", 56088), ("(1+2)*3", 9), ("7/2", 3.5), ("-2**3", -8),
                                                ("1,234 * 2", 2468), ("10 // 3 + 10 % 3", 4), ("2^10", 1024),
                                                ("3 × 4", 12)])
def test_calculator_values(expression, value):
    assert safe_eval(expression) == value


@pytest.mark.parametrize("expression", ["__import__('os')", "abs(-1)", "x + 1", "2 ** 1000", "9**9**9", "1/0",
                                        "[1, 2]", "'a' * 3", "", "1 +", "1 if 1 else 2", "(-8) ** 0.5"])
def test_calculator_refuses(expression):
    with pytest.raises(CalculatorError):
        safe_eval(expression)


def test_calculator_tool_returns_text_and_errors():
    tool = CalculatorTool()
    response, reward, _ = asyncio.run(tool.execute("i", {"expression": "6*7"}))
    assert (response.text, reward) == ("42", 0.0)
    response, _, metrics = asyncio.run(tool.execute("i", {"expression": "open('x')"}))
    assert response.text.startswith("Error: unsupported element Call") and metrics["calculator_error"] == 1.0


def test_gsm8k_tool_reward_and_penalty():
    tool = Gsm8kTool()
    iid = asyncio.run(tool.create("x", ground_truth="72"))
    response, step, _ = asyncio.run(tool.execute(iid, {"answer": "70"}))
    assert "reward=0.0" in response.text and step == -0.05  # no improvement over 0
    response, step, _ = asyncio.run(tool.execute(iid, {"answer": "72"}))
    assert "reward=1.0" in response.text and step == 0.0
    assert asyncio.run(tool.calc_reward(iid)) == 1.0
    assert tool.name == "calc_gsm8k_reward"


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_tool_config_file_verl_format(tmp_path):
    path = write(tmp_path, "tools.yaml", """
        tools:
          - class_name: verl.tools.gsm8k_tool.Gsm8kTool
            config: {type: native}
            tool_schema:
              type: function
              function:
                name: calc_gsm8k_reward
                description: check an answer
                parameters: {type: object, properties: {answer: {type: string}}, required: [answer]}
          - class_name: npu_rl.agent.tools.calculator.CalculatorTool
            config: {timeout: 2}
        """)
    tools = load_tools(path)
    assert sorted(tools) == ["calc_gsm8k_reward", "calculator"]
    assert isinstance(tools["calc_gsm8k_reward"], Gsm8kTool) and tools["calculator"].timeout_s == 2.0
    assert tools["calc_gsm8k_reward"].tool_schema.description == "check an answer"


def test_tool_config_errors_name_the_file(tmp_path):
    missing = write(tmp_path, "missing.yaml", "tools:\n  - class_name: npu_rl.agent.tools.nope.NoTool\n")
    with pytest.raises(ToolConfigError, match=r"missing\.yaml, tools\[0\]: cannot load class"):
        load_tools(missing)
    not_tool = write(tmp_path, "nottool.yaml", "tools:\n  - class_name: collections.OrderedDict\n")
    with pytest.raises(ToolConfigError, match="not a subclass of npu_rl.agent.tools.base.BaseTool"):
        load_tools(not_tool)
    code = write(tmp_path, "code.yaml", "tools: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(ToolConfigError, match="code.yaml: not valid YAML"):
        load_tools(code)
    with pytest.raises(ToolConfigError, match="no such file"):
        load_tools(str(tmp_path / "absent.yaml"))
    no_schema = write(tmp_path, "noschema.yaml", "tools:\n  - class_name: npu_rl.agent.tools.base.BaseTool\n")
    with pytest.raises(ToolConfigError, match="needs a tool_schema"):
        load_tools(no_schema)
    if importlib.util.find_spec("verl") is None:  # a verl tool (ReTool's CustomSandboxFusionTool subclasses one)
        recipe = write(tmp_path, "sandbox_tool.py", "from verl.tools.sandbox_fusion_tools import SandboxFusionTool\n"
                                                    "class CustomSandboxFusionTool(SandboxFusionTool):\n    pass\n")
        verl_tool = write(tmp_path, "verl_tool.yaml", f"tools:\n  - class_name: {recipe}:CustomSandboxFusionTool\n")
        with pytest.raises(ToolConfigError, match=r"No module named 'verl'; the module imports verl \(not installed\), "
                                                  r"and verl's tool classes are not npu-rl tools"):
            load_tools(verl_tool)


def test_tool_class_by_file_path(tmp_path):
    module = write(tmp_path, "my_tool.py", """
        from npu_rl.agent.tools.base import BaseTool, FunctionSchema

        class Echo(BaseTool):
            @classmethod
            def default_schema(cls):
                return FunctionSchema("echo")

            async def execute(self, instance_id, parameters, **kwargs):
                return str(parameters), None, {}
        """)
    path = write(tmp_path, "tools.yaml", f"tools:\n  - class_name: {module}:Echo\n")
    assert list(load_tools(path)) == ["echo"]


def test_hermes_parser():
    content, calls = parse_hermes('hm <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call> ok')
    assert content == "hm  ok" and (calls[0].name, calls[0].arguments, calls[0].error) == ("f", {"a": 1}, None)
    _, calls = parse_hermes('<tool_call>{"name": "f", "arguments": "{\\"a\\": 2}"}</tool_call>'
                            '<tool_call>{"name": "g"}</tool_call>')
    assert [(c.name, c.arguments) for c in calls] == [("f", {"a": 2}), ("g", {})]
    for bad, message in [("<tool_call>{name: f}</tool_call>", "not valid JSON"),
                         ('<tool_call>["f"]</tool_call>', "must be a JSON object"),
                         ('<tool_call>{"name": "f", "arguments": 3}</tool_call>', "arguments must be"),
                         ('<tool_call>{"name": "f"', "never closed")]:
        _, calls = parse_hermes(bad)
        assert len(calls) == 1 and message in calls[0].error
    assert parse_hermes("no calls here") == ("no calls here", [])


class SlowTool(BaseTool):
    default_timeout_s = 0.05

    @classmethod
    def default_schema(cls):
        return FunctionSchema("slow_async")

    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.sleep(5)
        return ToolResponse("late"), None, {}


class BlockingTool(BaseTool):
    default_timeout_s = 0.05

    @classmethod
    def default_schema(cls):
        return FunctionSchema("blocking")

    def execute(self, instance_id, parameters, **kwargs):  # a plain function: runs in a thread
        time.sleep(0.3)
        return ToolResponse("late"), None, {}


class RaisingTool(BaseTool):
    @classmethod
    def default_schema(cls):
        return FunctionSchema("raising", parameters={"type": "object", "properties": {}, "required": ["x"]})

    async def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("boom")


def call(name, args='{}'):
    return f'<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'


@pytest.mark.parametrize("reply, expected, counter", [
    (call("slow_async"), "Error: slow_async did not answer within 0.05 s", "num_tool_timeouts"),
    (call("blocking"), "Error: blocking did not answer within 0.05 s", "num_tool_timeouts"),
    (call("raising", '{"x": 1}'), "Error: raising failed: RuntimeError: boom", "num_tool_errors"),
    (call("raising"), "Error: raising needs the argument(s) x", "num_tool_errors"),
    (call("nope"), "Error: there is no tool named 'nope'", "num_tool_errors"),
    ("<tool_call>{oops}</tool_call>", "Error: the tool call is not valid JSON", "num_tool_errors"),
])
def test_failures_go_back_to_the_model_as_tool_messages(tiny_tokenizer, reply, expected, counter):
    tok = tiny_tokenizer
    tools = {t.name: t for t in (SlowTool(), BlockingTool(), RaisingTool())}
    server = ScriptedServer(tok, {"go": [reply, "done"]})
    start = time.perf_counter()
    out = asyncio.run(ToolAgentLoop(context(tok, server, tools=tools, response_length=600)).run(
        AgentSample([], [{"role": "user", "content": "go"}])))
    assert time.perf_counter() - start < 2.0  # cut at the timeout, not waited for
    text = tok.decode(out.response_ids)
    assert f"<|im_start|>tool\n{expected}" in text and text.endswith("done<|im_end|>")
    assert getattr(out, counter) == 1 and out.num_tool_calls == 1


def test_max_parallel_calls_and_tool_response_truncation(tiny_tokenizer):
    tok = tiny_tokenizer
    two = call("calculator", '{"expression": "2**60"}') + call("calculator", '{"expression": "1+1"}')
    tools = {"calculator": CalculatorTool()}
    server = ScriptedServer(tok, {"go": [two, "ok"]})
    out = asyncio.run(ToolAgentLoop(context(tok, server, tools=tools, max_tool_response_length=6,
                                            tool_response_truncate_side="left")).run(
        AgentSample([], [{"role": "user", "content": "go"}])))
    assert out.num_tool_calls == 1
    assert "<|im_start|>tool\n115292...(truncated)<|im_end|>" in tok.decode(out.response_ids)
