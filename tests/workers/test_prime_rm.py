"""PRIME's implicit PRM worker: it starts as its reference (scores 0, loss log 2), its update does not depend on how
the mini-batch is cut into micro-batches, and a few updates on fixed outcomes teach it to rank the right answer
first (its summed implicit reward follows the outcome)."""

from __future__ import annotations

import math

import torch

from npu_rl.config.loader import load_config
from npu_rl.protocol import Batch
from npu_rl.trainer.preflight import run_settings_for
from npu_rl.workers.roles import worker_specs
from tests.trainer.conftest import base_overrides


def _worker(model_dir: str, out: str, micro: int, lr: float):
    config = load_config(base_overrides(model_dir, out) + [
        "data.max_response_length=3", "data.oversample_factor=1", "data.train_batch_size=2",
        "reward_model.mini_batch_size=4", f"reward_model.micro_batch_size_per_gpu={micro}",
        f"reward_model.model.optim.lr={lr}", "actor_rollout_ref.rollout.n=2"], "prime_trainer")
    spec = worker_specs(config, run_settings_for(config))["prm"]
    worker = spec.cls(*spec.args)
    worker.init_model(total_training_steps=10)
    return worker


def _batch() -> Batch:
    prompts = torch.tensor([[0, 10, 11], [0, 10, 11], [12, 13, 14], [12, 13, 14]])  # left-padded
    responses = torch.tensor([[20, 21, 0], [22, 23, 24], [25, 28, 0], [26, 27, 0]])
    response_mask = (responses != 0).long()
    attention_mask = torch.cat([(prompts != 0).long(), response_mask], 1)
    return Batch({"prompts": prompts, "responses": responses, "response_mask": response_mask,
                  "input_ids": torch.cat([prompts, responses], 1), "attention_mask": attention_mask,
                  "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
                  "acc": torch.tensor([1.0, 0.0, 0.0, 1.0])}, {"uid": ["a", "a", "b", "b"]})


def test_prm_starts_at_its_reference_and_micro_batches_do_not_change_the_update(tiny_model_dir, tmp_path):
    whole, split = (_worker(tiny_model_dir, str(tmp_path / f"r{m}"), m, 1e-3) for m in (4, 1))
    first = whole.compute_rm_score(_batch())
    assert torch.equal(first.batch["rm_scores"], torch.zeros(4, 3))
    assert first.metrics["reward_model/raw_reward"] == 0.0
    grads = {}
    for key, worker in (("whole", whole), ("split", split)):  # the gradient the optimizer steps with
        optimizer = worker.engine.optimizer
        optimizer.register_step_pre_hook(lambda opt, *_, key=key: grads.__setitem__(
            key, [p.grad.clone() for group in opt.param_groups for p in group["params"]]))
    a, b = whole.update_rm(_batch()).metrics, split.update_rm(_batch()).metrics
    assert math.isclose(a["reward_model/dpo_loss"], math.log(2), rel_tol=1e-6)
    assert math.isclose(a["reward_model/grad_norm"], b["reward_model/grad_norm"], rel_tol=1e-5)
    assert a["reward_model/grad_norm"] > 0
    for g, h in zip(grads["whole"], grads["split"], strict=True):
        torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-7)


def test_prm_learns_to_rank_the_right_answer_first(tiny_model_dir, tmp_path):
    worker = _worker(tiny_model_dir, str(tmp_path / "run"), 2, 1e-2)
    losses = [worker.update_rm(_batch()).metrics["reward_model/dpo_loss"] for _ in range(6)]
    assert losses[-1] < losses[0] - 0.05, losses
    out = worker.compute_rm_score(_batch())
    assert out.metrics["reward_model/dpo_acc"] == 1.0  # in both groups the right answer scores higher
    # and its summed implicit reward (the last token left out: granularity token) has the outcome's sign
    assert out.metrics["reward_model/dpo_acc_abs"] == 1.0
