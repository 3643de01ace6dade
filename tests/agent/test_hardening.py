"""The agent path against hostile or careless input: rows never name code, every call has a deadline that fires
(even when the tool blocks its thread or the event loop), and a loop that exits, raises or returns garbage fails
only its own sample, named."""

from __future__ import annotations

import asyncio
import time

import pytest

from npu_rl.agent.interactions import BaseInteraction
from npu_rl.agent.loops import AgentSample, ToolAgentLoop, row_agent_loop
from npu_rl.agent.runner import run_agent_loops
from npu_rl.agent.tool_parser import parse_hermes
from npu_rl.agent.tools.base import BaseTool, FunctionSchema, ToolResponse
from npu_rl.agent.tools.config import ToolConfigError, load_tools
from npu_rl.agent.validate import agent_row_problems
from npu_rl.config.loader import load_config
from tests.agent.helpers import ScriptedServer, context
from tests.agent.test_runner import prompt_batch, scripted_batch_generate

EVIL = "import pathlib; pathlib.Path({marker!r}).write_text('ran')\n" \
       "from npu_rl.agent.loops import AgentLoopBase\nclass Evil(AgentLoopBase):\n    pass\n"


@pytest.mark.parametrize("name", ["{path}:Evil", "this", "os.path:join", "{path}"])
def test_a_row_cannot_name_code_to_load(tmp_path, name):
    marker = tmp_path / "ran.txt"
    path = tmp_path / "evil_loop.py"
    path.write_text(EVIL.format(marker=str(marker)))
    with pytest.raises(ValueError, match="not a registered agent loop.*may not name a file or module"):
        row_agent_loop(name.format(path=path), "data.parquet: row 3")
    assert not marker.exists()


def _agent_config(tmp_path, *overrides):
    return load_config(["actor_rollout_ref.rollout.mode=async", "data.return_raw_chat=True", *overrides])


def test_row_problems_name_the_file_and_row(tmp_path):
    marker = tmp_path / "ran.txt"
    (tmp_path / "evil_loop.py").write_text(EVIL.format(marker=str(marker)))
    interactions = tmp_path / "interactions.yaml"
    interactions.write_text("interaction:\n  - name: checker\n    class_name: "
                            "npu_rl.agent.interactions.AnswerCheckInteraction\n")
    config = _agent_config(tmp_path, f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={interactions}")
    rows = [("train.parquet: row 0", {"agent_name": "tool_agent"}),
            ("train.parquet: row 1", {"agent_name": f"{tmp_path}/evil_loop.py:Evil"}),
            ("train.parquet: row 2", {"agent_name": None, "extra_info": {"interaction_kwargs": {"name": "nope"}}}),
            ("train.parquet: row 3", {"extra_info": {"interaction_kwargs": {"name": "checker"}}})]
    problems = agent_row_problems(config, rows)
    assert len(problems) == 2
    assert problems[0].startswith("train.parquet: row 1: agent_name") and "may not name a file" in problems[0]
    assert problems[1].startswith("train.parquet: row 2: extra_info.interaction_kwargs.name='nope'")
    assert "known: checker" in problems[1]
    assert not marker.exists()


def test_rows_are_checked_before_the_models_load(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """``npu-rl train`` on a data set whose row names a file: rc 2 and the row named; no worker is built."""
    import pandas as pd

    from npu_rl.trainer import main_ppo, run

    marker = tmp_path / "ran.txt"
    (tmp_path / "evil_loop.py").write_text(EVIL.format(marker=str(marker)))
    data = tmp_path / "train.parquet"
    pd.DataFrame([{"prompt": [{"role": "user", "content": "1+1?"}], "data_source": "arith",
                   "reward_model": {"ground_truth": "2"}, "agent_name": f"{tmp_path}/evil_loop.py:Evil"}]
                 ).to_parquet(data)
    monkeypatch.setattr(run, "build_worker_group", lambda *a: pytest.fail("models were loaded"))
    code = main_ppo.main([f"data.train_files={data}", f"data.val_files={data}", "data.train_batch_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
                          "actor_rollout_ref.rollout.mode=async", "data.return_raw_chat=True",
                          f"actor_rollout_ref.model.path={tiny_model_dir}", "trainer.device=cpu",
                          f"trainer.default_local_dir={tmp_path}/ckpt", "trainer.logger=[console]"],
                         default_config="quickstart")
    assert code == 2 and not marker.exists()
    assert f"{data}: row 0: agent_name" in capsys.readouterr().err


@pytest.mark.parametrize("timeout", ["0", "-1", ".nan", ".inf", "soon"])
def test_tool_timeouts_that_mean_never_or_at_once_are_refused(tmp_path, timeout):
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n  - class_name: calculator\n    config: {timeout: %s}\n" % timeout)
    with pytest.raises(ToolConfigError, match=r"tools\[0\]: tool 'calculator': timeout=.* must be a"):
        load_tools(str(path))


class ThreadBlocker(BaseTool):
    default_timeout_s = 0.05

    @classmethod
    def default_schema(cls):
        return FunctionSchema("thread_blocker")

    def execute(self, instance_id, parameters, **kwargs):
        time.sleep(4)
        return ToolResponse("late"), None, {}


class LoopBlocker(BaseTool):
    default_timeout_s = 0.05

    @classmethod
    def default_schema(cls):
        return FunctionSchema("loop_blocker")

    async def execute(self, instance_id, parameters, **kwargs):
        time.sleep(4)  # blocks whatever event loop runs it
        return ToolResponse("late"), None, {}


class SlowCreate(BaseTool):
    default_timeout_s = 0.05

    @classmethod
    def default_schema(cls):
        return FunctionSchema("slow_create")

    async def create(self, instance_id=None, **kwargs):
        await asyncio.sleep(100)

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse("never"), None, {}


class BadReward(BaseTool):
    @classmethod
    def default_schema(cls):
        return FunctionSchema("bad_reward")

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse("ok"), float("nan"), {}


def call(name):
    return f'<tool_call>{{"name": "{name}", "arguments": {{}}}}</tool_call>'


@pytest.mark.parametrize("tool, counter", [(ThreadBlocker(), "num_tool_timeouts"), (LoopBlocker(), "num_tool_timeouts"),
                                           (SlowCreate(), "num_tool_timeouts"), (BadReward(), "num_tool_errors")])
def test_a_stuck_tool_is_cut_at_its_deadline_and_never_waited_for(tiny_tokenizer, tool, counter):
    tok = tiny_tokenizer
    server = ScriptedServer(tok, {"go": [call(tool.name), "done"]})
    start = time.perf_counter()
    out = asyncio.run(ToolAgentLoop(context(tok, server, tools={tool.name: tool}, response_length=600)).run(
        AgentSample([], [{"role": "user", "content": "go"}])))
    assert time.perf_counter() - start < 2.0  # asyncio.run's shutdown did not wait for the stuck thread either
    assert getattr(out, counter) == 1
    assert tok.decode(out.response_ids).endswith("done<|im_end|>")


def test_deeply_nested_tool_call_is_an_error_for_the_model():
    _, calls = parse_hermes("<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>")
    assert len(calls) == 1 and "nested too deeply" in calls[0].error


class Raising(BaseInteraction):
    default_name = "raising"

    async def generate_response(self, instance_id, messages, **kwargs):
        raise RuntimeError("judge down")


class Malformed(BaseInteraction):
    default_name = "malformed"

    async def generate_response(self, instance_id, messages, **kwargs):
        return True, "ok"


class Hanging(BaseInteraction):
    default_name = "hanging"

    def __init__(self, config=None):
        super().__init__({"timeout": 0.05, **(config or {})})

    async def generate_response(self, instance_id, messages, **kwargs):
        await asyncio.sleep(100)


@pytest.mark.parametrize("interaction, words", [
    (Raising(), "interaction 'raising': generate_response failed: RuntimeError: judge down"),
    (Malformed(), "interaction 'malformed': generate_response returned (True, 'ok'); expected a tuple"),
    (Hanging(), "interaction 'hanging': generate_response failed: UserCodeTimeout: did not answer within 0.05 s")])
def test_a_failing_interaction_fails_its_sample_named(tiny_tokenizer, interaction, words, caplog):
    tok = tiny_tokenizer
    generate, _ = scripted_batch_generate(tok, {"a": ["first", "second"], "b": ["plain"]})
    batch = prompt_batch(tok, ["a", "b"])
    batch.non_tensors["extra_info"] = [{"interaction_kwargs": {"name": interaction.name}}, {}]
    ctx = context(tok, None, interactions={interaction.name: interaction}, default_agent_loop="tool_agent")
    gen = run_agent_loops(batch, ctx, generate, n=1, pad_token_id=0, response_length=300, return_logprobs=False)
    out = gen.batch
    assert gen.metrics["agent_loop/failed_samples"] == 1
    assert out["response_mask"][0].sum() == 0 and out["response_mask"][1].sum() > 0
    assert f"row 0: {words}" in caplog.text


def test_system_exit_in_a_loop_is_a_failed_sample_and_an_all_failed_batch_raises(tiny_tokenizer, tmp_path,
                                                                                   caplog):
    from npu_rl.agent.loops import register_agent_loops_file

    (tmp_path / "quitter.py").write_text("from npu_rl.agent.loops import AgentLoopBase\n"
                                         "class Quitter(AgentLoopBase):\n"
                                         "    async def run(self, sample):\n        raise SystemExit(0)\n"
                                         "class Garbage(AgentLoopBase):\n"
                                         "    async def run(self, sample):\n        return 'nothing'\n")
    (tmp_path / "loops.yaml").write_text(f"- {{name: quitter, _target_: {tmp_path}/quitter.py:Quitter}}\n"
                                         f"- {{name: garbage, _target_: {tmp_path}/quitter.py:Garbage}}\n")
    register_agent_loops_file(str(tmp_path / "loops.yaml"))
    tok = tiny_tokenizer
    generate, _ = scripted_batch_generate(tok, {"a": ["x"], "b": ["y"], "c": ["z"]})
    gen = run_agent_loops(prompt_batch(tok, ["a", "b", "c"], ["quitter", "garbage", None]), context(tok, None),
                          generate, 1, 0, 50, False)
    out = gen.batch
    assert gen.metrics["agent_loop/failed_samples"] == 2
    assert "row 0: agent loop 'quitter' raised SystemExit" in caplog.text
    assert "row 1: agent loop 'garbage' returned str, not an AgentOutput" in caplog.text
    with pytest.raises(RuntimeError, match="every agent conversation of this batch failed.*'quitter' raised"):
        run_agent_loops(prompt_batch(tok, ["a"], ["quitter"]), context(tok, None), generate, 1, 0, 50, False)


HANGING_LOOPS = '''
import asyncio, threading, time
from npu_rl.agent.loops import AgentLoopBase, SingleTurnAgentLoop

class Forever(AgentLoopBase):  # awaits an event nobody sets
    async def run(self, sample):
        await asyncio.Event().wait()

class Stubborn(AgentLoopBase):  # swallows its cancellation
    async def run(self, sample):
        while True:
            try:
                await asyncio.sleep(100)
            except asyncio.CancelledError:
                pass

class InThread(AgentLoopBase):  # a thread of its own that never returns
    async def run(self, sample):
        await asyncio.to_thread(threading.Event().wait)

class SlowModel(SingleTurnAgentLoop):  # waits on the model longer than the deadline: not its own time
    pass
'''


def test_a_loop_awaiting_its_own_thing_forever_is_a_failed_sample_at_its_deadline(tiny_tokenizer, tmp_path,
                                                                                   caplog, monkeypatch):
    import threading

    from npu_rl.agent.loops import AGENT_LOOPS, register_agent_loops_file

    monkeypatch.setattr(AGENT_LOOPS, "_entries", dict(AGENT_LOOPS._entries))  # these names leave with the test

    (tmp_path / "hang.py").write_text(HANGING_LOOPS)
    (tmp_path / "loops.yaml").write_text("".join(f"- {{name: {n}, _target_: {tmp_path}/hang.py:{c}}}\n" for n, c in
                                                 [("forever", "Forever"), ("stubborn", "Stubborn"),
                                                  ("in_thread", "InThread"), ("slow_model", "SlowModel")]))
    register_agent_loops_file(str(tmp_path / "loops.yaml"))
    tok = tiny_tokenizer
    scripted, _ = scripted_batch_generate(tok, {q: ["ok"] for q in "abcde"})

    def slow_generate(token_lists, budgets):
        time.sleep(0.6)  # longer than the deadline: waiting on the model is not the sample's own time
        return scripted(token_lists, budgets)

    result = {}

    def rollout():
        result["gen"] = run_agent_loops(
            prompt_batch(tok, list("abcde"), ["forever", "stubborn", "in_thread", "slow_model", None]),
            context(tok, None, sample_timeout_s=0.4), slow_generate, 1, 0, 50, False)

    start = time.perf_counter()
    worker = threading.Thread(target=rollout, daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), "the rollout hung on a loop awaiting something that never completes"
    assert time.perf_counter() - start < 6  # deadline 0.4 s + 1 s grace for the stubborn task + two model calls
    gen = result["gen"]
    assert gen.metrics["agent_loop/failed_samples"] == 3
    for row, name in enumerate(["forever", "stubborn", "in_thread"]):
        assert (f"row {row}: agent loop {name!r} did not finish within rollout.agent.sample_timeout_s=0.4 s"
                in caplog.text)
    assert "ignored their cancellation; abandoned: row 1 (stubborn)" in caplog.text
    responses = gen.batch["response_mask"].sum(-1).tolist()
    assert responses[:3] == [0, 0, 0] and min(responses[3:]) > 0  # the others answered, the slow model's row too
    assert [t.name for t in threading.enumerate() if t.name.startswith("npu-rl-user-")]  # stuck, not joined

