"""A run folder keeps the resolved config (loadable again) and the exact command; the plot is written at the end."""

from __future__ import annotations

import glob
import json
import os

from npu_rl.config.loader import load_config
from npu_rl.trainer.main_ppo import main
from tests.trainer.conftest import base_overrides


def test_a_run_keeps_its_config_and_command_and_draws_its_curves(tiny_model_dir, tmp_path, reward_file, capsys):
    out_dir = str(tmp_path / "out")
    overrides = base_overrides(tiny_model_dir, out_dir, reward_file) + [
        "preset=grpo", "trainer.total_training_steps=2", "trainer.val_before_train=True", "trainer.test_freq=2"]
    assert main(overrides, default_config="ppo_trainer") == 0
    (run_dir,) = glob.glob(os.path.join(out_dir, "logs", "*"))
    with open(os.path.join(run_dir, "command.json")) as f:
        record = json.load(f)
    assert record["argv"] == ["python", "-m", "npu_rl.trainer.main_ppo"] + overrides
    assert record["cwd"] == os.getcwd()
    with open(os.path.join(run_dir, "command.sh")) as f:
        assert "npu_rl.trainer.main_ppo" in f.read()
    again = load_config([], "config", run_dir)
    assert again == load_config(overrides, "ppo_trainer")
    assert again.trainer.total_training_steps == 2 and again.actor_rollout_ref.model.path == tiny_model_dir
    for name in ("metrics.jsonl", "curves.png", "curves.html"):
        assert os.path.getsize(os.path.join(run_dir, name)) > 0, name
    assert "curves.png" in capsys.readouterr().err


def test_secrets_are_not_recorded():
    from npu_rl.tracking.run_record import recorded_environment

    env = recorded_environment({"SWANLAB_API_KEY": "abc", "DEVICE": "npu", "HOME": "/root", "HCCL_CONNECT_TIMEOUT": "7"})
    assert env == {"SWANLAB_API_KEY": "<redacted>", "DEVICE": "npu", "HCCL_CONNECT_TIMEOUT": "7"}
