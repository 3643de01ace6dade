"""The actor update with the fused kernels (linear -> log-prob/entropy, and PPO + KL in one op) equals the plain
update: same metrics and same weights after two mini-batch steps (fp32; chunked reductions in another order)."""

from __future__ import annotations

import pytest
import torch

from npu_rl.config.loader import load_config
from npu_rl.trainer.preflight import run_settings_for
from npu_rl.protocol import Batch
from npu_rl.workers.actor import ActorWorker
from npu_rl.workers.model_runner import MicroBatching
from tests.models.lora.common import actor_batch
from tests.trainer.conftest import base_overrides


def _batch(rows: int = 8, prompt: int = 12, response: int = 6) -> Batch:
    return actor_batch(rows, prompt, response)  # left-padded prompts, short responses, old/ref log-probs, advantages


def _update(model_dir, tmp_path, fused: bool) -> tuple[dict, dict]:
    config = load_config(base_overrides(model_dir, str(tmp_path)) + [
        "preset=grpo", "data.max_response_length=6", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.actor.clip_ratio_high=0.28",
        f"actor_rollout_ref.model.use_fused_kernels={fused}",
        "actor_rollout_ref.model.fused_kernel_options.impl_backend=torch"])
    arr = config.actor_rollout_ref
    worker = ActorWorker(arr.model, arr.actor, MicroBatching(), run_settings_for(config))
    worker.init_model(total_training_steps=1)
    metrics = worker.update_policy(_batch()).metrics
    return metrics, {k: v.detach().clone() for k, v in worker.model.state_dict().items()}


def test_fused_update_equals_plain(tiny_model_dir, tmp_path):
    plain_metrics, plain_weights = _update(tiny_model_dir, tmp_path / "plain", fused=False)
    fused_metrics, fused_weights = _update(tiny_model_dir, tmp_path / "fused", fused=True)
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/grad_norm"):
        assert fused_metrics[key] == pytest.approx(plain_metrics[key], rel=1e-5, abs=1e-6), key
    for name, value in plain_weights.items():
        if name.endswith("k_proj.bias"):  # zero gradient in exact arithmetic; AdamW amplifies float noise
            continue
        torch.testing.assert_close(fused_weights[name], value, rtol=1e-4, atol=1e-6, msg=name)
