"""User code of an agent loop that tries to end the process: ``os._exit(0)`` in a tool (plain or ``async``), an
interaction or a user's agent loop stops the rollout with an error naming the row, the loop and the function (the
run ends non-zero) (``npu_rl/agent/user_code.py``; ``SystemExit`` / ``KeyboardInterrupt`` in a tool:
tests/agent/test_exits.py).

Before (issue 39): ``os._exit(0)`` ended the trainer with status 0 at the first tool call, nothing printed.

Each case runs in a child process: if the guard failed, ``os._exit(0)`` would end pytest itself, with status 0."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

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


def test_a_run_whose_agent_loop_ends_the_process_says_so_in_one_line(tiny_model_dir, tmp_path):
    """The same guard in a training run (``python -m npu_rl.trainer.main_ppo``): exit 1 and one line naming row and
    loop, not an AgentExitError traceback (issue 39)."""
    from tests.trainer.conftest import REWARD_FN, base_overrides

    (tmp_path / "exiting.py").write_text(EXITING)
    (tmp_path / "loops.yaml").write_text(f"- {{name: quitter, _target_: {tmp_path}/exiting.py:QuittingLoop}}\n")
    (tmp_path / "reward.py").write_text(REWARD_FN)
    argv = base_overrides(tiny_model_dir, str(tmp_path / "run"), str(tmp_path / "reward.py")) + [
        "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.agent.default_agent_loop=quitter",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={tmp_path / 'loops.yaml'}",
        "data.return_raw_chat=True", "algorithm.adv_estimator=grpo", "trainer.total_training_steps=1",
        "trainer.val_before_train=False", "trainer.test_freq=0"]
    result = subprocess.run([sys.executable, "-m", "npu_rl.trainer.main_ppo", *argv], capture_output=True, text=True,
                            timeout=300, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": REPO_ROOT,
                                                             "OMP_NUM_THREADS": "1"})
    assert result.returncode == 1, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("npu-rl: error: ")]
    assert len(errors) == 1 and "agent loop 'quitter' called os._exit(0), which would have ended the trainer" in \
        errors[0], result.stderr[-3000:]
