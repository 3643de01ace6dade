"""The actor update with the fused kernels (linear -> log-prob/entropy, and PPO + KL in one op) equals the plain
update: same metrics and same weights after two mini-batch steps (fp32; chunked reductions in another order)."""

from __future__ import annotations

import pytest
import torch

from npu_rl.config.derived import build_plan
from npu_rl.config.loader import load_config
from npu_rl.protocol import Batch
from npu_rl.workers.actor import ActorWorker
from npu_rl.workers.model_runner import MicroBatching
from tests.trainer.conftest import base_overrides


def _batch(rows: int = 8, prompt: int = 12, response: int = 6) -> Batch:
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 100, (rows, prompt), generator=g)
    responses = torch.randint(3, 100, (rows, response), generator=g)
    prompt_mask = torch.ones(rows, prompt, dtype=torch.long)
    prompt_mask[::2, :3] = 0  # left padding on half the rows
    response_mask = torch.ones(rows, response, dtype=torch.long)
    response_mask[1::3, -2:] = 0  # short responses
    attention = torch.cat([prompt_mask, response_mask], 1)
    return Batch({
        "prompts": prompts, "responses": responses, "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], 1), "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "old_logprobs": -torch.rand(rows, response, generator=g) * 5 * response_mask,
        "ref_logprobs": -torch.rand(rows, response, generator=g) * 5 * response_mask,
        "advantages": torch.randn(rows, response, generator=g) * response_mask,
    })


def _update(model_dir, tmp_path, fused: bool) -> tuple[dict, dict]:
    config = load_config(base_overrides(model_dir, str(tmp_path)) + [
        "preset=grpo", "data.max_response_length=6", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.actor.clip_ratio_high=0.28",
        f"actor_rollout_ref.model.use_fused_kernels={fused}",
        "actor_rollout_ref.model.fused_kernel_options.impl_backend=torch"], validate=False)
    arr = config.actor_rollout_ref
    worker = ActorWorker(arr.model, arr.actor, MicroBatching(), build_plan(config))
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
