"""The rollout pool's worker (the asynchronous trainers' own engine) samples from ``trainer.seed``: two pools built
with one seed generate the same tokens whatever the process's generators held before, another seed other tokens."""

from __future__ import annotations

import torch

from npu_rl.config.loader import load_config
from npu_rl.trainer.preflight import run_settings_for
from npu_rl.workers.rollout_pool import RolloutPoolWorker
from tests.rollout.conftest import make_prompts
from tests.trainer.conftest import base_overrides


def pool_responses(model_dir: str, out: str, seed: int, noise: int) -> torch.Tensor:
    config = load_config(base_overrides(model_dir, out) + [
        "actor_rollout_ref.hybrid_engine=False", "rollout.nnodes=1", "rollout.n_gpus_per_node=1",
        f"trainer.seed={seed}", "async_training.mode=one_step_off"], "one_step_off_ppo_trainer")
    arr = config.actor_rollout_ref
    torch.manual_seed(noise)  # whatever ran in this process before: the pool's sampling must not depend on it
    torch.rand(noise)
    worker = RolloutPoolWorker(arr.model, arr.rollout, run_settings_for(config))
    worker.init_model()
    prompts = make_prompts(worker.tokenizer, ["1+2=", "37*4=", "9-8="])
    return worker.generate_sequences(prompts).batch["responses"]


def test_the_pool_samples_from_the_trainer_seed(tiny_model_dir, tmp_path):
    first = pool_responses(tiny_model_dir, str(tmp_path / "a"), seed=7, noise=1)
    again = pool_responses(tiny_model_dir, str(tmp_path / "b"), seed=7, noise=12345)
    other = pool_responses(tiny_model_dir, str(tmp_path / "c"), seed=8, noise=1)
    assert first.shape == (3 * 4, 8)  # 3 prompts x rollout.n=4, data.max_response_length=8
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
