"""Resume with LoRA: after a kill in the middle of a step, the resumed run ends with exactly the adapter of a run
that was never interrupted (checkpoints hold only the adapter, its AdamW state, the scheduler and RNG)."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from safetensors.torch import load_file

from tests.models.lora.common import LORA
from tests.trainer.conftest import base_overrides, step_rows
from tests.e2e.test_resume import ROWS_PER_STEP, _train_subprocess

pytestmark = pytest.mark.slow  # three training processes


def _adapter(out_dir: str, step: int) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(out_dir, f"global_step_{step}", "actor", "lora_adapter", "adapter_model.safetensors"))


def test_lora_resume_after_a_kill_mid_step_matches_an_uninterrupted_run(tiny_model_dir, tmp_path, reward_file):
    common = ["preset=grpo", "trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.val_before_train=False",
              *LORA, "actor_rollout_ref.actor.optim.lr=1e-2"]
    straight = str(tmp_path / "straight")
    done = _train_subprocess(base_overrides(tiny_model_dir, straight, reward_file) + common)
    assert done.returncode == 0, done.stderr[-3000:]

    killed = str(tmp_path / "killed")
    overrides = base_overrides(tiny_model_dir, killed, reward_file) + common + ["trainer.resume_mode=auto"]
    crash = {"NPU_RL_TEST_CRASH_AFTER": str(ROWS_PER_STEP + 5), "NPU_RL_TEST_COUNTER": str(tmp_path / "calls")}
    first = _train_subprocess(overrides, crash)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]  # killed while scoring step 2
    assert sorted(step_rows(killed)) == [1]
    model_keys = os.listdir(os.path.join(killed, "global_step_1", "actor"))
    assert "lora_adapter" in model_keys

    second = _train_subprocess(overrides)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr and "global_step_1" in second.stderr  # our messages go to stderr
    assert sorted(step_rows(killed)) == [1, 2, 3]
    expected, got = _adapter(straight, 3), _adapter(killed, 3)
    assert expected.keys() == got.keys() and len(expected) == 2 * 2 * 7
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0, msg=name)
    first_step = _adapter(straight, 1)
    assert any(not torch.equal(first_step[k], expected[k]) for k in expected)  # the adapter moved between steps
