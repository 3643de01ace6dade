"""One-step off-policy on the tiny model: a rollout pool (one Ray actor, its own hf engine) and the trainer (this
process) joined by a gloo weight group; every step's batch is one policy version old after the first."""

from __future__ import annotations

import math

import pytest

from npu_rl.config.loader import load_config
from tests.trainer.conftest import base_overrides, read_metrics, reward_file, step_rows  # noqa: F401

pytestmark = pytest.mark.usefixtures("ray_session")


def async_overrides(model_dir, out, reward_file):
    return [o for o in base_overrides(model_dir, out, reward_file)] + [
        "actor_rollout_ref.hybrid_engine=False", "rollout.nnodes=1", "rollout.n_gpus_per_node=1"]


def test_one_step_off_trains_with_one_version_lag(tiny_model_dir, tmp_path, reward_file):
    from npu_rl.trainer.run import run

    out = str(tmp_path / "run")
    config = load_config(async_overrides(tiny_model_dir, out, reward_file) + [
        "preset=grpo", "trainer.total_training_steps=3", "trainer.test_freq=3", "trainer.val_before_train=False",
        "async_training.mode=one_step_off"], "one_step_off_ppo_trainer")
    assert run(config) == 0
    rows = step_rows(out)
    assert sorted(rows) == [1, 2, 3]
    assert rows[1]["async/staleness/hist_0"] == 1.0  # the first batch: the initial weights, which the trainer has
    for step in (2, 3):
        assert rows[step]["async/staleness/hist_1"] == 1.0 and rows[step]["async/staleness/max"] == 1.0
        assert rows[step]["weight_sync/buckets"] >= 1 and rows[step]["weight_sync/version"] == step - 1
        assert 0.0 <= rows[step]["async/overlap_ratio"] <= 1.0
        assert math.isfinite(rows[step]["actor/pg_loss"])
    assert "val-core/arith/acc/mean@1" in read_metrics(out)[-1] or "val-core/arith/acc/mean@1" in rows[3]
    import ray

    left = [info["name"] for info in ray.util.placement_group_table().values() if info["state"] != "REMOVED"]
    assert not left, f"the rollout pool's devices were not given back: {left}"


def test_one_step_off_runs_with_one_seed_end_with_the_same_weights(tiny_model_dir, tmp_path, reward_file):
    """The pool's sampling is seeded from trainer.seed (npu_rl/workers/rollout_pool.py), so a run is repeatable;
    another seed samples other responses."""
    import torch

    from npu_rl.trainer.run import run
    from tests.trainer.conftest import final_weights

    def one_run(name: str, seed: int):
        out = str(tmp_path / name)
        config = load_config(async_overrides(tiny_model_dir, out, reward_file) + [
            "preset=grpo", "trainer.total_training_steps=2", "trainer.save_freq=2", "trainer.test_freq=0",
            "trainer.val_before_train=False", f"trainer.seed={seed}", "async_training.mode=one_step_off"],
            "one_step_off_ppo_trainer")
        assert run(config) == 0
        rows = step_rows(out)
        sampled = {k: v for step in sorted(rows) for k, v in rows[step].items()
                   if k.startswith(("response_length/", "critic/score/", "actor/pg_loss"))}
        return sampled, final_weights(out, 2)

    first, first_weights = one_run("a", seed=11)
    again, again_weights = one_run("b", seed=11)
    other, _ = one_run("c", seed=12)
    assert first and first == again
    for name, tensor in first_weights.items():
        assert torch.equal(tensor, again_weights[name]), name
    assert first != other
