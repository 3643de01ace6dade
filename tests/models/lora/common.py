"""Shared by the LoRA tests: an actor batch and configs on the tiny model."""

from __future__ import annotations

import torch

from npu_rl.config.loader import load_config
from npu_rl.protocol import Batch
from tests.trainer.conftest import base_overrides

LORA = ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8"]


def actor_batch(rows: int = 8, prompt: int = 12, response: int = 6, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
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


def actor_config(model_dir: str, out_dir: str, *extra: str):
    return load_config(base_overrides(model_dir, out_dir) + [
        "preset=grpo", "data.max_response_length=6", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.optim.lr=1e-2", *extra])


def actor_worker(config):
    """An ActorWorker from a root config, as roles.py slices it (log-prob micro-batches from the rollout keys)."""
    from npu_rl.trainer.preflight import run_settings_for
    from npu_rl.workers.actor import ActorWorker
    from npu_rl.workers.model_runner import MicroBatching

    arr = config.actor_rollout_ref
    micro = MicroBatching(arr.rollout.log_prob_micro_batch_size_per_gpu, arr.rollout.log_prob_use_dynamic_bsz,
                          arr.rollout.log_prob_max_token_len_per_gpu)
    return ActorWorker(arr.model, arr.actor, micro, run_settings_for(config))


def actor_rollout_worker(config):
    from npu_rl.trainer.preflight import run_settings_for
    from npu_rl.workers.actor_rollout import ActorRolloutWorker

    arr = config.actor_rollout_ref
    return ActorRolloutWorker(arr.model, arr.actor, arr.rollout, run_settings_for(config))
