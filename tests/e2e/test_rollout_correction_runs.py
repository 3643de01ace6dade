"""``algorithm.rollout_correction``: verl's keys and defaults, validation, and GRPO steps with every mode."""

from __future__ import annotations

import math

import pytest
import torch

from npu_rl.config.loader import ConfigError, load_config
from npu_rl.trainer.preflight import check as validate, run_settings_for
from npu_rl.protocol import Batch
from npu_rl.trainer.rollout_correction import bypass_old_logprobs, correct_batch
from tests.trainer.conftest import base_overrides, run_training, step_rows

KEY = "algorithm.rollout_correction"


def test_keys_and_defaults_are_verls():
    rc = load_config([]).algorithm.rollout_correction
    assert (rc.rollout_is, rc.rollout_is_threshold, rc.rollout_rs, rc.rollout_rs_threshold, rc.bypass_mode,
            rc.loss_type, rc.rollout_is_batch_normalize) == (None, 2.0, None, None, False, "ppo_clip", False)
    assert load_config([]).actor_rollout_ref.rollout.calculate_log_probs is False


@pytest.mark.parametrize("extra", [[f"{KEY}.rollout_is=token"], [f"{KEY}.rollout_rs=token_k1",
                                                                   f"{KEY}.rollout_rs_threshold=2.0"],
                                   [f"{KEY}.bypass_mode=true"]])
def test_the_correction_turns_rollout_logprobs_on(extra):
    """In the plan: the config stays as written (nothing changes it after loading)."""
    config = load_config(extra)
    assert config.actor_rollout_ref.rollout.calculate_log_probs is False
    assert run_settings_for(config).rollout_logprobs
    assert not run_settings_for(load_config([])).rollout_logprobs


@pytest.mark.parametrize("extra, message", [
    ([f"{KEY}.rollout_is=tokens"], f"{KEY}.rollout_is='tokens'"),
    ([f"{KEY}.rollout_is=token", f"{KEY}.rollout_is_threshold='3_2'"], f"{KEY}.rollout_is_threshold="),
    ([f"{KEY}.rollout_rs=geometric", f"{KEY}.rollout_rs_threshold=2"], "use 'seq_mean_k1'"),
    ([f"{KEY}.rollout_rs=token_k1"], f"{KEY}.rollout_rs_threshold=None: rejection"),
    ([f"{KEY}.rollout_rs_threshold=2.0"], "rollout_rs is null"),
    ([f"{KEY}.rollout_is_batch_normalize=true"], "needs importance weights"),
    ([f"{KEY}.loss_type=reinforce"], "only applies in bypass mode"),
    ([f"{KEY}.loss_type=pg"], f"{KEY}.loss_type='pg'"),
    ([f"{KEY}.bypass_mode=true", "actor_rollout_ref.actor.policy_loss.loss_mode=gspo"], "would be ignored"),
    (["actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode"], f"needs {KEY}.bypass_mode=true"),
])
def test_bad_settings_are_refused_naming_the_key(extra, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        validate(load_config(extra), check_paths=False, check_device=False)


def test_verls_bypass_example_validates():
    # examples/rollout_correction/run_qwen2_5_7b_fsdp.sh in verl (RLOO, bypass, REINFORCE, self-normalised)
    validate(load_config(["preset=rloo", f"{KEY}.rollout_is=sequence", f"{KEY}.rollout_is_threshold=2.0",
                          f"{KEY}.rollout_is_batch_normalize=true", f"{KEY}.rollout_rs=null",
                          f"{KEY}.rollout_rs_threshold=null", f"{KEY}.bypass_mode=true",
                          f"{KEY}.loss_type=reinforce"]), check_paths=False, check_device=False)


def _batch() -> Batch:
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    rollout = torch.full((2, 4), -1.0)
    old = rollout + torch.tensor([[3.0, 0.6, 1.0, 1.0], [1.5, 4.0, 1.0, 1.0]]).log()
    return Batch({"old_logprobs": old, "rollout_logprobs": rollout, "response_mask": mask})


def test_correct_batch_adds_weights_and_filters_the_mask_without_touching_its_input():
    config = load_config([f"{KEY}.rollout_is=token", f"{KEY}.rollout_rs=token_k1", f"{KEY}.rollout_rs_threshold=2"])
    batch = _batch()
    out, metrics = correct_batch(batch, config)
    torch.testing.assert_close(out["rollout_is_weights"], torch.tensor([[2.0, 0.6, 1.0, 0], [1.5, 2.0, 0, 0]]))
    assert out["response_mask"].tolist() == [[0, 1, 1, 0], [1, 0, 0, 0]]  # ratios 3 and 4 outside [1/2, 2]
    assert batch["response_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]] and "rollout_is_weights" not in batch
    assert metrics["rollout_corr/rollout_rs_masked_fraction"].item() == pytest.approx(0.4)
    assert "rollout_corr/kl" in metrics and "rollout_corr/ppl_ratio" in metrics


def test_metrics_only_without_correction_and_errors_without_logprobs():
    out, metrics = correct_batch(_batch(), load_config([]))
    assert "rollout_is_weights" not in out and "rollout_corr/chi2_token" in metrics
    no_logprobs = Batch({"old_logprobs": torch.zeros(1, 2), "response_mask": torch.ones(1, 2)})
    assert correct_batch(no_logprobs, load_config([]))[1] == {}
    with pytest.raises(RuntimeError, match="calculate_log_probs"):
        correct_batch(no_logprobs, load_config([f"{KEY}.rollout_is=token"]))
    with pytest.raises(RuntimeError, match="calculate_log_probs"):
        bypass_old_logprobs(no_logprobs)
    assert torch.equal(bypass_old_logprobs(_batch())["old_logprobs"], _batch()["rollout_logprobs"])


MODES = {
    "metrics_only": [],
    "token_tis": [f"{KEY}.rollout_is=token", f"{KEY}.rollout_is_threshold=2.0"],
    "seq_mis_geo_rs": [f"{KEY}.rollout_is=sequence", f"{KEY}.rollout_is_threshold='0.5_2.0'",
                       f"{KEY}.rollout_rs=seq_mean_k1", f"{KEY}.rollout_rs_threshold=1.5"],
    "bypass_ppo_clip": [f"{KEY}.bypass_mode=true", f"{KEY}.rollout_is=token"],
    "bypass_reinforce": [f"{KEY}.bypass_mode=true", f"{KEY}.loss_type=reinforce", f"{KEY}.rollout_is=token",
                         f"{KEY}.rollout_rs=token_k1", f"{KEY}.rollout_rs_threshold=2.0"],
}


@pytest.mark.parametrize("mode", list(MODES))
def test_grpo_step_with_each_mode(mode, tiny_model_dir, tmp_path, reward_file):
    out = str(tmp_path / "run")
    extra = MODES[mode] or ["actor_rollout_ref.rollout.calculate_log_probs=true"]
    code = run_training(base_overrides(tiny_model_dir, out, reward_file) + [
        "preset=grpo", "trainer.total_training_steps=1", "trainer.val_before_train=False", "trainer.test_freq=-1",
        *extra])
    assert code == 0
    row = step_rows(out)[1]
    for key in ("rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/ppl_ratio", "rollout_corr/log_ppl_diff",
                "rollout_corr/training_ppl", "rollout_corr/rollout_ppl", "rollout_corr/chi2_token"):
        assert math.isfinite(row[key]), (key, row)
    bypass = mode.startswith("bypass")
    assert ("timing_s/old_log_prob" in row) != bypass  # bypass mode skips the recomputation
    if mode != "metrics_only":
        assert 0 < row["rollout_corr/rollout_is_mean"] <= 2.0 and 0 < row["rollout_corr/rollout_is_eff_sample_size"]
    if "rs" in mode or mode == "bypass_reinforce":
        assert 0 <= row["rollout_corr/rollout_rs_masked_fraction"] <= 1
    if not bypass:
        # fp32 actor, hf rollout with the same module: the two log-probs agree closely
        assert abs(row["rollout_corr/kl"]) < 1e-3
