"""The training engine under every role: shuffling, update counts and checkpoints behave the same for the actor and
the critic (the critic's own copy of the update loop had lost ``critic.shuffle`` and its update count)."""

from __future__ import annotations

import pytest
import torch

from npu_rl.config.loader import load_config
from npu_rl.trainer.preflight import run_settings_for
from npu_rl.protocol import Batch
from npu_rl.workers.actor import ActorWorker
from npu_rl.workers.critic import CriticWorker
from npu_rl.workers.model_runner import MicroBatching
from tests.trainer.conftest import base_overrides
from tests.workers.test_fused_update import _batch

ROWS = 8


def _config(model_dir, out_dir, *extra):
    return load_config(base_overrides(model_dir, str(out_dir)) + [
        "preset=ppo", f"critic.model.path={model_dir}", "data.max_response_length=6", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "critic.ppo_mini_batch_size=1", "critic.ppo_micro_batch_size_per_gpu=2",
        "critic.model.enable_gradient_checkpointing=False", "critic.optim.lr=1e-3",
        "critic.model.fsdp_config.mixed_precision.param_dtype=fp32", *extra])


def _training_batch() -> Batch:
    batch = _batch(rows=ROWS)
    g = torch.Generator().manual_seed(1)
    mask = batch["response_mask"].float()
    return batch.union(Batch({"values": torch.randn(ROWS, 6, generator=g) * mask,
                              "returns": torch.randn(ROWS, 6, generator=g) * mask,
                              "row_id": torch.arange(ROWS)}))


def _build(role: str, config):
    run_settings = run_settings_for(config)
    if role == "critic":
        return CriticWorker(config.critic, run_settings)
    arr = config.actor_rollout_ref
    return ActorWorker(arr.model, arr.actor, MicroBatching(), run_settings)


def _update(worker, batch):
    return worker.update_critic(batch) if isinstance(worker, CriticWorker) else worker.update_policy(batch)


def _rows_seen(worker, batch) -> list[int]:
    """The row order the worker's loss saw in one update (one row per micro-batch ... concatenated)."""
    seen: list[int] = []
    real = worker.micro_loss

    def recording(mb, denominators):
        seen.extend(mb["row_id"].tolist())
        return real(mb, denominators)

    worker.micro_loss = recording
    try:
        _update(worker, batch)
    finally:
        worker.micro_loss = real
    return seen


def _expected_order(seed: int, num_updates: int) -> list[int]:
    return torch.randperm(ROWS, generator=torch.Generator().manual_seed(seed + num_updates)).tolist()


@pytest.mark.parametrize("role", ["actor", "critic"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_role_honours_its_shuffle_setting(role, shuffle, tiny_model_dir, tmp_path):
    key = "critic.shuffle" if role == "critic" else "actor_rollout_ref.actor.shuffle"
    config = _config(tiny_model_dir, tmp_path, f"{key}={shuffle}")
    worker = _build(role, config)
    worker.init_model(total_training_steps=3)
    batch = _training_batch()
    seed = config.trainer.seed
    for num_updates in range(2):  # a new order every update, seeded by the seed and the update count
        expected = _expected_order(seed, num_updates) if shuffle else list(range(ROWS))
        assert _rows_seen(worker, batch) == expected


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_every_role_restores_its_update_count(role, tiny_model_dir, tmp_path):
    """After save at update 1 and load into a fresh worker, the next update shuffles as an uninterrupted run."""
    key = "critic.shuffle" if role == "critic" else "actor_rollout_ref.actor.shuffle"
    config = _config(tiny_model_dir, tmp_path, f"{key}=True")
    batch = _training_batch()
    first = _build(role, config)
    first.init_model(total_training_steps=3)
    _update(first, batch)
    first.save_checkpoint(str(tmp_path / "ckpt"))
    second = _build(role, config)
    second.init_model(total_training_steps=3)
    second.load_checkpoint(str(tmp_path / "ckpt"))
    assert second.engine.num_updates == 1
    for (name, a), b in zip(first.engine.model.state_dict().items(), second.engine.model.state_dict().values()):
        torch.testing.assert_close(b, a, msg=name)
    assert _rows_seen(second, batch) == _expected_order(config.trainer.seed, 1)


def test_update_metrics_of_both_roles_have_the_same_shape(tiny_model_dir, tmp_path):
    config = _config(tiny_model_dir, tmp_path)
    batch = _training_batch()
    actor, critic = _build("actor", config), _build("critic", config)
    actor.init_model(total_training_steps=1)
    critic.init_model(total_training_steps=1)
    actor_metrics = actor.update_policy(batch).metrics
    critic_metrics = critic.update_critic(batch).metrics
    for role, metrics, loss_key in (("actor", actor_metrics, "pg_loss"), ("critic", critic_metrics, "vf_loss")):
        assert {f"{role}/{k}" for k in ("grad_norm", "lr", "nan_skipped", loss_key)} <= set(metrics)
        assert metrics[f"{role}/nan_skipped"] == 0.0 and metrics[f"{role}/grad_norm"] > 0


def test_no_gradient_outlives_the_update(tiny_model_dir, tmp_path):
    """The last optimizer step's gradients are freed with the update: they would otherwise hold a fp32 copy of every
    trainable weight through the next rollout and log-prob passes."""
    config = _config(tiny_model_dir, tmp_path)
    for role, update in (("actor", "update_policy"), ("critic", "update_critic")):
        worker = _build(role, config)
        worker.init_model(total_training_steps=1)
        assert getattr(worker, update)(_training_batch()).metrics[f"{role}/grad_norm"] > 0
        held = [n for n, p in worker.engine.model.named_parameters() if p.grad is not None]
        held += [n for n, p in worker.engine.compute_model.named_parameters() if p.grad is not None]
        assert not held, (role, held[:3])
