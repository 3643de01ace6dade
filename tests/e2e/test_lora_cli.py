"""A LoRA GRPO step through the trainer (KL loss on: the reference is the actor with its adapter off, no reference
worker), then `npu-rl merge` and `npu-rl eval` on what it saved."""

from __future__ import annotations

import json
import os

from npu_rl.cli import main as cli
from tests.models.lora.common import LORA
from tests.trainer.conftest import base_overrides, run_training, step_rows


def test_lora_train_merge_eval(tiny_model_dir, tmp_path, reward_file, capsys):
    run_dir = str(tmp_path / "run")
    assert run_training(base_overrides(tiny_model_dir, run_dir, reward_file) + [
        "preset=grpo", "actor_rollout_ref.actor.use_kl_loss=True", "trainer.total_training_steps=1",
        "trainer.val_before_train=False", "trainer.save_freq=1", *LORA]) == 0
    row = step_rows(run_dir)[1]
    assert 0.0 <= row["actor/kl_loss"] < 1e-3  # adapter B starts at 0: the policy starts as the reference
    actor_dir = os.path.join(run_dir, "global_step_1", "actor")
    adapter = os.path.join(actor_dir, "lora_adapter")
    with open(os.path.join(adapter, "adapter_config.json")) as f:
        assert json.load(f)["base_model_name_or_path"] == tiny_model_dir

    assert cli(["merge", run_dir, "--out", str(tmp_path / "merged")]) == 0
    assert os.path.isfile(tmp_path / "merged" / "tokenizer.json")
    assert cli(["merge", run_dir, "--out", str(tmp_path / "adapter"), "--adapter-only"]) == 0
    capsys.readouterr()
    for args in ([tiny_model_dir, "--adapter", adapter], [os.path.join(run_dir, "global_step_1")]):
        assert cli(["eval", *args, "--task", "arith", "--limit", "2", "--engine", "hf", "--max-new-tokens", "2"]) == 0
        assert json.loads(capsys.readouterr().out)["num_problems"] == 2


def test_lora_grpo_learns_on_a_tiny_model(tiny_model_dir, tmp_path, reward_file):
    """The LoRA twin of tests/e2e/test_trainer.py's learning test, with the KL loss on (reference = the actor
    with its adapter off): the mean reward of the last 4 steps beats the first 4 by the same margin. The reward
    counts one token, so the adapter includes lm_head (through the swapped head); with 'all-linear' alone the mean
    reward rose only from 0.01 to 0.04 in 16 steps at lr 1e-2 or 5e-2."""
    out = str(tmp_path / "run")
    assert run_training(base_overrides(tiny_model_dir, out, reward_file) + [
        "preset=grpo", "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head]",
        "actor_rollout_ref.model.lora_alpha=16", "actor_rollout_ref.rollout.n=8", "trainer.total_training_steps=16",
        "trainer.val_before_train=False"]) == 0
    rows = [row for _, row in sorted(step_rows(out).items())]
    scores = [row["critic/score/mean"] for row in rows]
    first, last = sum(scores[:4]) / 4, sum(scores[-4:]) / 4
    assert last > first + 0.15, scores
    assert rows[-1]["actor/kl_loss"] > 0  # the policy moved away from the reference
