"""The actor's loss copies its micro-batch tensors to the device before the forward is queued. A blocking
host-to-device copy waits for everything queued on the device (CUDA: ATen's ``memcpy_and_sync``); made after the
forward, it keeps the host from launching the backward until the forward has run, once per micro-batch."""

from __future__ import annotations

import sys

import torch

from npu_rl.config.loader import load_config
from npu_rl.trainer.preflight import run_settings_for
from npu_rl.workers import actor as actor_module
from npu_rl.workers.actor import ActorWorker
from npu_rl.workers.model_runner import MicroBatching
from tests.models.lora.common import actor_batch
from tests.trainer.conftest import base_overrides


def test_loss_inputs_reach_the_device_before_the_forward(tiny_model_dir, tmp_path, monkeypatch):
    config = load_config(base_overrides(tiny_model_dir, str(tmp_path)) + [
        "preset=grpo", "data.max_response_length=6", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"])
    arr = config.actor_rollout_ref
    worker = ActorWorker(arr.model, arr.actor, MicroBatching(), run_settings_for(config))
    worker.init_model(total_training_steps=1)
    events: list[str] = []
    forward, micro_loss, to = worker.engine.forward_logprob_stats, worker.micro_loss, torch.Tensor.to

    def recorded_forward(*args, **kwargs):
        events.append("forward")
        return forward(*args, **kwargs)

    def recorded_micro_loss(*args, **kwargs):
        events.append("micro-batch")
        return micro_loss(*args, **kwargs)

    def recorded_to(self, *args, **kwargs):
        if sys._getframe(1).f_code.co_filename == actor_module.__file__:  # the actor's own copies
            events.append("copy")
        return to(self, *args, **kwargs)

    monkeypatch.setattr(worker.engine, "forward_logprob_stats", recorded_forward)
    monkeypatch.setattr(worker, "micro_loss", recorded_micro_loss)
    monkeypatch.setattr(torch.Tensor, "to", recorded_to)
    worker.update_policy(actor_batch(8, 12, 6))  # 2 mini-batches x 2 micro-batches; use_kl_loss: 4 copies each

    per_micro_batch = " ".join(events).split("micro-batch")[1:]
    assert len(per_micro_batch) == 4
    for events_of_one in per_micro_batch:
        assert events_of_one.split() == ["copy"] * 4 + ["forward"]
