"""One training step on the tiny model for each algorithm and verl setting added for issue 13: the new policy
losses, GDPO on the reward function's components, token-sum, a micro-batch size that does not divide the per-rank
mini-batch (runs, as in verl) and the deprecated global micro-batch key."""

from __future__ import annotations

import math

import pytest

from tests.trainer.conftest import base_overrides, run_training, step_rows


@pytest.mark.parametrize("extra", [
    ["actor_rollout_ref.actor.policy_loss.loss_mode=sapo"],
    ["actor_rollout_ref.actor.policy_loss.loss_mode=dro", "actor_rollout_ref.actor.policy_loss.dro_beta=0.1"],
    ["actor_rollout_ref.actor.policy_loss.loss_mode=dppo_kl", "actor_rollout_ref.actor.clip_ratio_c=20.0"],
    ["actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "actor_rollout_ref.actor.loss_agg_mode=token-sum"],
    ["algorithm.adv_estimator=gdpo", "+algorithm.gdpo_reward_keys=[score,acc]", "+algorithm.gdpo_reward_weights=[1.0,0.5]"],
    ["algorithm.adv_estimator=rloo_vectorized", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"],
    ["actor_rollout_ref.actor.ppo_micro_batch_size=4"],
    ["algorithm.adv_estimator=optimal_token_baseline", "actor_rollout_ref.actor.calculate_sum_pi_squared=True"],
    ["algorithm.adv_estimator=tir_optimal_token_baseline", "actor_rollout_ref.actor.calculate_sum_pi_squared=True",
     "actor_rollout_ref.model.use_remove_padding=True"],
], ids=["sapo", "dro", "dppo_kl", "gspo-token-sum", "gdpo", "rloo_vectorized-uneven-micro", "global-micro", "otb",
        "tir-otb-packed"])
def test_a_step_runs(extra, tiny_model_dir, tmp_path, reward_file):
    out = str(tmp_path / "run")
    overrides = base_overrides(tiny_model_dir, out, reward_file)
    if "actor_rollout_ref.actor.ppo_micro_batch_size=4" in extra:
        overrides = [o for o in overrides if not o.startswith("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")]
    assert run_training(overrides + ["preset=grpo", "trainer.total_training_steps=1", "trainer.val_before_train=False",
                                     *extra]) == 0
    row = step_rows(out)[1]
    assert math.isfinite(row["actor/pg_loss"]) and math.isfinite(row["actor/grad_norm"])
