"""Resume: after a kill in the middle of a step, and at an epoch boundary (verl #7401 ran zero steps there).

A resumed run must end with exactly the weights of a run that was never interrupted: same data order, same
sampling (RNG states restored), no finished step lost, no step done twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import torch

from npu_rl.trainer.checkpoint import load_trainer_state
from tests.conftest import REPO_ROOT
from tests.trainer.conftest import base_overrides, final_weights, run_training, step_rows

ROWS_PER_STEP = 4 * 4  # 4 prompts x rollout.n=4; the custom reward function is called once per row


def _train_subprocess(overrides: list[str], extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO_ROOT, **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "npu_rl.trainer.main_ppo", *overrides], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def test_resume_after_a_kill_mid_step_matches_an_uninterrupted_run(tiny_model_dir, tmp_path, reward_file):
    common = ["preset=grpo", "trainer.total_training_steps=4", "trainer.save_freq=1", "trainer.val_before_train=False"]
    straight = str(tmp_path / "straight")
    done = _train_subprocess(base_overrides(tiny_model_dir, straight, reward_file) + common)
    assert done.returncode == 0, done.stderr[-3000:]

    killed = str(tmp_path / "killed")
    overrides = base_overrides(tiny_model_dir, killed, reward_file) + common + ["trainer.resume_mode=auto"]
    crash = {"NPU_RL_TEST_CRASH_AFTER": str(2 * ROWS_PER_STEP + 5), "NPU_RL_TEST_COUNTER": str(tmp_path / "calls")}
    first = _train_subprocess(overrides, crash)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]  # killed while scoring step 3
    assert sorted(step_rows(killed)) == [1, 2]
    assert not os.path.exists(os.path.join(killed, "global_step_3"))

    second = _train_subprocess(overrides)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr and "global_step_2" in second.stderr  # our messages go to stderr
    assert sorted(step_rows(killed)) == [1, 2, 3, 4]
    import glob

    assert len(glob.glob(os.path.join(killed, "logs", "*", "metrics.jsonl"))) == 1  # one run, one curve
    _assert_same_weights(final_weights(killed, 4), final_weights(straight, 4))


def test_resume_at_an_epoch_boundary_continues_into_the_next_epoch(tiny_model_dir, tmp_path, reward_file, capsys):
    # 8 training prompts / 4 per step = 2 steps per epoch.
    common = ["preset=grpo", "trainer.save_freq=2", "trainer.val_before_train=False"]
    straight = str(tmp_path / "straight")
    assert run_training(base_overrides(tiny_model_dir, straight, reward_file) + common + ["trainer.total_epochs=2"]) == 0

    resumed = str(tmp_path / "resumed")
    overrides = base_overrides(tiny_model_dir, resumed, reward_file) + common + ["trainer.resume_mode=auto"]
    assert run_training(overrides + ["trainer.total_epochs=1"]) == 0
    assert sorted(step_rows(resumed)) == [1, 2]
    capsys.readouterr()
    assert run_training(overrides + ["trainer.total_epochs=2"]) == 0
    assert "(step 2, epoch 1)" in capsys.readouterr().err
    assert sorted(step_rows(resumed)) == [1, 2, 3, 4]
    state = load_trainer_state(os.path.join(resumed, "global_step_4"))
    assert (state["prompts"]["epoch"], state["prompts"]["batches_done"]) == (2, 0)
    _assert_same_weights(final_weights(resumed, 4), final_weights(straight, 4))

    # Nothing left: a clear message and exit code 0, not a silent zero-step "success" with a wrong state.
    capsys.readouterr()
    assert run_training(overrides + ["trainer.total_epochs=2"]) == 0
    assert "nothing left to train" in capsys.readouterr().err
