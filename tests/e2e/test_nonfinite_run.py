"""A run whose updates are all skipped (a loss term went NaN/inf) ends non-zero, and its first non-finite step says
which term it was and the likely key, instead of printing "finished" with rc 0 and nothing trained."""

from __future__ import annotations

import textwrap

from npu_rl.trainer.main_ppo import main
from npu_rl.trainer.metrics import likely_cause, nonfinite_terms
from tests.trainer.conftest import base_overrides, reward_file  # noqa: F401 (fixture)

NAN_LOSS = textwrap.dedent("""
    from npu_rl.core.aggregation import LossOutput
    from npu_rl.core.policy_loss import vanilla_policy_loss

    def nan_policy_loss(inputs):
        out = vanilla_policy_loss(inputs)
        return LossOutput(out.loss * float("nan"), out.metrics)
    """)


def test_all_updates_skipped_ends_non_zero_naming_the_term(tiny_model_dir, tmp_path, reward_file, capsys):
    loss = tmp_path / "nan_loss.py"
    loss.write_text(NAN_LOSS)
    overrides = base_overrides(tiny_model_dir, str(tmp_path / "out"), reward_file) + [
        "preset=grpo", "trainer.total_training_steps=2", "trainer.val_before_train=False",
        "trainer.max_consecutive_nan_steps=5", f"actor_rollout_ref.actor.policy_loss.loss_mode={loss}:nan_policy_loss"]
    assert main(overrides, default_config="ppo_trainer") == 1
    err = capsys.readouterr().err
    assert err.count("npu-rl: warning: step 1: actor/pg_loss") == 1  # said once, at the first step
    assert "likely the policy loss: actor_rollout_ref.actor.optim.lr" in err
    assert "every one of the 2 step(s) of this run skipped its updates" in err


def test_the_likely_cause_follows_the_first_non_finite_term():
    metrics = {"actor/pg_loss": 0.1, "actor/kl_loss": float("inf"), "actor/grad_norm": float("nan"),
               "critic/score/mean": 0.5}
    assert nonfinite_terms(metrics) == ["actor/kl_loss", "actor/grad_norm"]
    assert likely_cause(metrics).startswith("actor/kl_loss, actor/grad_norm went non-finite; likely the KL loss: "
                                            "actor_rollout_ref.actor.kl_loss_coef")
    assert "actor_rollout_ref.actor.optim.lr" in likely_cause({"actor/grad_norm": float("inf")})
