"""Fully asynchronous training on the tiny model: the rollout pool (one Ray actor) streams one-prompt batches into
the bounded queue; the trainer takes require_batches x ppo_mini_batch_size prompts per update, pushes its weights
every trigger_parameter_sync_step updates and bounds staleness. Its resume, after a SIGKILL and after Ctrl-C, is
test_kill_and_resume.py's."""

from __future__ import annotations

import math
import os

import pytest

from npu_rl.config.loader import load_config
from npu_rl.trainer.checkpoint import STATE_FILE, step_dir
from npu_rl.utils.safe_load import load_state
from tests.async_training.test_one_step_off import async_overrides
from tests.trainer.conftest import reward_file, step_rows  # noqa: F401

pytestmark = pytest.mark.usefixtures("ray_session")


def fully_async(model_dir, out, reward_file, steps: int, resume: str):
    return load_config(async_overrides(model_dir, out, reward_file) + [
        "preset=grpo", f"trainer.total_training_steps={steps}", "trainer.test_freq=0", "trainer.save_freq=2",
        "trainer.val_before_train=False", f"trainer.resume_mode={resume}", "data.train_batch_size=0",
        "async_training.staleness_threshold=0.5", "async_training.trigger_parameter_sync_step=2",
        "async_training.require_batches=1", "rollout.total_rollout_steps=null"], "fully_async_ppo_trainer")


def test_streams_syncs_and_bounds_staleness(tiny_model_dir, tmp_path, reward_file):
    from npu_rl.trainer.run import run

    out = str(tmp_path / "run")
    config = fully_async(tiny_model_dir, out, reward_file, steps=4, resume="disable")
    assert config.data.train_batch_size == 0 and config.async_training.mode == "fully_async"
    assert run(config) == 0
    rows = step_rows(out)
    assert sorted(rows) == [1, 2, 3, 4]
    assert rows[1]["weight_sync/version"] == 0  # the pool starts from the trainer's weights
    assert rows[2]["weight_sync/version"] == 2 and rows[4]["weight_sync/version"] == 4  # every 2 updates
    assert "weight_sync/version" not in rows[3]
    for row in rows.values():
        assert row["async/staleness/max"] <= 1  # ceil(0.5) pushes
        assert 0.0 <= row["trainer/idle_ratio"] <= 1.0 and 0.0 <= row["rollouter/idle_ratio"] <= 1.0
        assert row["async/queue_depth_prompts"] >= 0 and math.isfinite(row["actor/pg_loss"])
        assert row["response_length/mean"] > 0
    # 2 prompts x 4 samples per update
    assert rows[4]["global_seqlen/balanced_max"] > 0 and rows[4]["perf/total_num_tokens"] > 0

    # each version pushed once: at the first rollout, then every 2 updates (not also when the next rollout starts)
    state = load_state(os.path.join(step_dir(out, 4), STATE_FILE))["rollouts"]
    assert state["updates"] == 4 and state["pushed"] == [0, 2, 4]
    # a resume (after a kill, after Ctrl-C) is tested on this run's command line in test_kill_and_resume.py
