"""PRIME end to end through ``npu-rl train --config-name prime_trainer`` on a tiny random model (CPU): the implicit
PRM (a trainable copy of the policy) is updated on the outcomes every step and scores the tokens, the oversampled
batch is cut to train_batch_size groups, verl's metric names are logged; a run stopped at a checkpoint and resumed
ends with the actor's and the PRM's weights of a run that was never stopped."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

from tests.conftest import REPO_ROOT
from tests.trainer.conftest import base_overrides, final_weights, step_rows

STEPS = 4


def _train(overrides: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO_ROOT}
    return subprocess.run([sys.executable, "-m", "npu_rl.cli", "train", "--config-name", "prime_trainer", *overrides],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


def _prm_weights(out_dir: str, step: int) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    from npu_rl.parallel.checkpoint import merge_checkpoint

    merged = merge_checkpoint(os.path.join(out_dir, f"global_step_{step}", "reward_model"),
                              os.path.join(out_dir, "merged_prm"))
    return AutoModelForCausalLM.from_pretrained(merged).state_dict()


def test_prime_trains_its_prm_and_resumes(tiny_model_dir, tmp_path, reward_file):
    prime = ["data.train_batch_size=2", "data.oversample_factor=2", "reward_model.model.optim.lr=1e-3",
             "reward_model.micro_batch_size_per_gpu=2", "algorithm.use_kl_in_reward=True",
             "trainer.test_freq=0", "trainer.save_freq=2"]
    straight = str(tmp_path / "straight")
    done = _train(base_overrides(tiny_model_dir, straight, reward_file) + prime
                  + [f"trainer.total_training_steps={STEPS}", f"trainer.rollout_data_dir={tmp_path / 'rollouts'}"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "algorithm.use_kl_in_reward=True has no effect with PRIME" in done.stderr
    rows = step_rows(straight)
    assert sorted(rows) == list(range(1, STEPS + 1))
    for key in ("dpo_loss", "grad_norm", "lr", "reward", "raw_reward", "dpo_acc", "dpo_acc_abs"):
        assert f"reward_model/{key}" in rows[1], key
    assert "acc" in rows[1] and "timing_s/reward_model" in rows[1]
    # the PRM starts as its reference (log-ratio 0, loss log 2) and moves with its updates
    assert abs(rows[1]["reward_model/dpo_loss"] - 0.6931) < 0.02
    assert all(rows[s]["reward_model/raw_reward"] != 0 for s in rows)
    # the oversampled batch (4 prompts x 4 samples) is cut to train_batch_size=2 groups: 8 rows trained
    with open(os.path.join(str(tmp_path / "rollouts"), "1.jsonl"), encoding="utf-8") as f:
        assert sum(1 for line in f if line.strip()) == 8
    # the PRM trained: its weights left the policy's initial ones
    base = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    prm = _prm_weights(straight, 2)
    assert any(not torch.equal(prm[k], base[k]) for k in base if k in prm)

    stopped = str(tmp_path / "stopped")
    half = _train(base_overrides(tiny_model_dir, stopped, reward_file) + prime + ["trainer.total_training_steps=2"])
    assert half.returncode == 0, half.stderr[-3000:]
    assert os.path.isdir(os.path.join(stopped, "global_step_2", "reward_model"))
    resumed = _train(base_overrides(tiny_model_dir, stopped, reward_file) + prime
                     + [f"trainer.total_training_steps={STEPS}", "trainer.resume_mode=auto"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr and "global_step_2" in resumed.stderr
    for weights in (final_weights, _prm_weights):
        a, b = weights(stopped, STEPS), weights(straight, STEPS)
        assert a.keys() == b.keys()
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)
