"""A LoRA GRPO step through the trainer (KL loss on: the reference is the actor with its adapter off, no reference
worker), then `npu-rl merge` and `npu-rl eval` on what it saved."""

from __future__ import annotations

import json
import os

from npu_rl.cli import main as cli
from tests.lora.common import LORA
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
