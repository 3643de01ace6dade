"""Ctrl-C / SIGTERM at several points of a run: the step finishes, a checkpoint is written, the exact resume command
is printed, the exit code is 130 / 143, and resuming ends with the weights of an uninterrupted run. A second signal
stops at once and leaves the previous checkpoint whole. Also: a run folder holding checkpoints is never overwritten
silently. The signal is sent by the reward function (in-process), so it lands at a known point of a known step.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from npu_rl.config.loader import ConfigError
from npu_rl.trainer.checkpoint import latest_step, saved_steps, verify_step
from npu_rl.trainer.preflight import load_checked
from tests.conftest import REPO_ROOT
from tests.trainer.conftest import base_overrides, final_weights, run_training, step_rows

ROWS_PER_STEP = 4 * 4  # 4 prompts x rollout.n=4: reward calls per step

REWARD = textwrap.dedent("""\
    import os
    import signal

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        at = [int(x) for x in os.environ.get("FAULT_SIGNAL_AT", "").split(",") if x]
        if at:
            counter = os.environ["FAULT_COUNTER"]
            calls = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
            with open(counter, "w") as f:
                f.write(str(calls))
            if calls in at:
                os.kill(os.getpid(), getattr(signal, os.environ.get("FAULT_SIGNAL", "SIGINT")))
        sevens = solution_str.count("7")
        return {"score": sevens / max(len(solution_str), 1), "acc": float(sevens > 0)}
    """)


@pytest.fixture
def reward(tmp_path):
    path = tmp_path / "reward_signal.py"
    path.write_text(REWARD)
    return str(path)


@pytest.fixture
def fault_env(tmp_path, monkeypatch):
    def arm(at: str, sig: str = "SIGINT") -> None:
        monkeypatch.setenv("FAULT_SIGNAL_AT", at)
        monkeypatch.setenv("FAULT_SIGNAL", sig)
        monkeypatch.setenv("FAULT_COUNTER", str(tmp_path / f"calls_{at}_{sig}"))
    return arm


COMMON = ["preset=grpo", "trainer.val_before_train=False"]


def test_ctrl_c_mid_step_saves_prints_the_resume_command_and_resumes_to_the_same_weights(tiny_model_dir, tmp_path,
                                                                                         reward):
    steps = ["trainer.total_training_steps=3", "trainer.save_freq=3"]  # saves only at the end, by itself
    straight = str(tmp_path / "straight")
    assert run_training(base_overrides(tiny_model_dir, straight, reward) + COMMON + steps) == 0

    out = str(tmp_path / "interrupted")
    argv = base_overrides(tiny_model_dir, out, reward) + COMMON + steps
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO_ROOT, "FAULT_SIGNAL_AT": str(ROWS_PER_STEP + 3),
           "FAULT_COUNTER": str(tmp_path / "calls")}  # in step 2's reward phase
    first = subprocess.run([sys.executable, "-m", "npu_rl.trainer.main_ppo", *argv], cwd=REPO_ROOT, env=env,
                           capture_output=True, text=True, timeout=600)
    assert first.returncode == 130, first.stderr[-3000:]
    assert "Traceback" not in first.stderr
    assert saved_steps(out) == [2] and latest_step(out) == 2
    verify_step(os.path.join(out, "global_step_2"))
    assert f"saved step 2 to {os.path.join(os.path.abspath(out), 'global_step_2')}" in first.stderr
    command = re.search(r"npu-rl: resume with: (.*)", first.stderr).group(1)
    resume = shlex.split(command)
    assert resume[:3] == [sys.executable, "-m", "npu_rl.trainer.main_ppo"] and resume[-1] == "trainer.resume_mode=auto"

    env.pop("FAULT_SIGNAL_AT")
    second = subprocess.run(resume, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr and "global_step_2" in second.stderr  # our messages go to stderr
    assert sorted(step_rows(out)) == [1, 2, 3]
    a, b = final_weights(out, 3), final_weights(straight, 3)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def test_sigterm_during_validation_before_training_exits_143_saving_nothing(tiny_model_dir, tmp_path, reward,
                                                                            fault_env, capsys):
    fault_env("1", "SIGTERM")
    out = str(tmp_path / "run")
    code = run_training(base_overrides(tiny_model_dir, out, reward) + ["preset=grpo", "trainer.val_before_train=True",
                                                                       "trainer.total_training_steps=2"])
    assert code == 143
    assert "stopped before the first step finished; nothing to save" in capsys.readouterr().err
    assert saved_steps(out) == []


def test_an_interrupt_during_a_save_lets_it_finish_and_saves_once(tiny_model_dir, tmp_path, reward, monkeypatch,
                                                                   capsys):
    from npu_rl.trainer.checkpoint import CheckpointManager

    commit = CheckpointManager.commit
    commits = []

    def commit_with_a_signal(self, step, tmp, state):
        commits.append(step)
        os.kill(os.getpid(), signal.SIGINT)  # arrives in the middle of the save
        return commit(self, step, tmp, state)

    monkeypatch.setattr(CheckpointManager, "commit", commit_with_a_signal)
    out = str(tmp_path / "run")
    code = run_training(base_overrides(tiny_model_dir, out, reward) + COMMON + ["trainer.total_training_steps=3",
                                                                                "trainer.save_freq=1"])
    assert code == 130 and commits == [1]  # step 1's save completed, and was not repeated
    verify_step(os.path.join(out, "global_step_1"))
    assert "step 1 is saved in" in capsys.readouterr().err


def test_a_second_ctrl_c_stops_at_once_and_the_last_checkpoint_stays_whole(tiny_model_dir, tmp_path, reward,
                                                                          fault_env):
    fault_env(f"{ROWS_PER_STEP + 2},{ROWS_PER_STEP + 4}")  # twice in step 2's reward phase
    out = str(tmp_path / "run")
    with pytest.raises(KeyboardInterrupt):
        run_training(base_overrides(tiny_model_dir, out, reward) + COMMON + ["trainer.total_training_steps=3",
                                                                             "trainer.save_freq=1"])
    assert saved_steps(out) == [1] and latest_step(out) == 1
    verify_step(os.path.join(out, "global_step_1"))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers given back


def test_a_folder_with_another_runs_checkpoints_is_never_overwritten_silently(tiny_model_dir, tmp_path, reward,
                                                                              capsys):
    out = str(tmp_path / "run")
    overrides = base_overrides(tiny_model_dir, out, reward) + COMMON + ["trainer.total_training_steps=1",
                                                                        "trainer.save_freq=1"]
    assert run_training(overrides) == 0
    from npu_rl.trainer.main_ppo import main

    assert main(overrides) == 2  # refused before the model loads
    err = capsys.readouterr().err
    assert f"trainer.default_local_dir={os.path.abspath(out)} already holds checkpoints of steps [1]" in err
    for choice in ("trainer.resume_mode=auto", "another trainer.default_local_dir", "trainer.overwrite_checkpoints"):
        assert choice in err
    with pytest.raises(ConfigError, match="already holds"):
        run_training(overrides)
    assert saved_steps(out) == [1]
    from npu_rl.trainer.preflight import prepare_run_folder

    prepare_run_folder(load_checked(overrides + ["trainer.overwrite_checkpoints=True"], "ppo_trainer"))
    assert saved_steps(out) == [] and latest_step(out) is None


def test_embedded_default_resumes_and_saves_on_interrupt():
    config = load_checked([], "quickstart")
    assert config.trainer.resume_mode == "auto" and config.trainer.save_on_interrupt


def test_reward_pool_workers_ignore_ctrl_c(tmp_path):
    from npu_rl.reward.pool import ProcessPoolRunner
    from npu_rl.reward.score_fn import ScoreFnSpec

    runner = ProcessPoolRunner(ScoreFnSpec(), num_workers=1, timeout_s=30)
    try:
        payload = dict(data_source="arith", solution_str="4", ground_truth="4", extra_info={})
        assert runner.run([payload])[0].status == "ok"
        os.kill(runner._workers[0].process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does to the group
        assert runner.run([payload])[0].status == "ok" and runner._workers[0].process.poll() is None
    finally:
        runner.close()
    assert all(w.process.poll() is not None for w in runner._workers) or not runner._workers
