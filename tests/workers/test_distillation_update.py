"""The actor's update with distillation on: verl's metrics, the extremes reduced over the micro-batches of a
mini-batch (MicroLoss.extremes), and without task rewards the update follows the distillation loss alone."""

from __future__ import annotations

import torch

from npu_rl.config.loader import load_config
from npu_rl.protocol import Batch
from npu_rl.trainer.preflight import run_settings_for
from npu_rl.workers.actor import ActorWorker, logprob_options
from npu_rl.workers.model_runner import MicroBatching
from tests.trainer.conftest import base_overrides
from tests.workers.test_fused_update import _batch


def _worker(model_dir, tmp_path, *extra) -> ActorWorker:
    config = load_config(base_overrides(model_dir, str(tmp_path)) + [
        "preset=grpo", "data.max_response_length=6", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.shuffle=False", "distillation.enabled=True",
        f"distillation.teacher_models.teacher_model.model_path={model_dir}", *extra])
    arr = config.actor_rollout_ref
    worker = ActorWorker(arr.model, arr.actor, MicroBatching(), run_settings_for(config))
    worker.init_model(total_training_steps=1)
    return worker


def _distil_batch() -> Batch:
    batch = _batch()
    g = torch.Generator().manual_seed(4)
    return batch.union(Batch({"teacher_logprobs": -torch.rand(batch["responses"].shape, generator=g) * 4}))


def test_metrics_and_extremes_over_micro_batches(tiny_model_dir, tmp_path):
    worker = _worker(tiny_model_dir, tmp_path)
    seen = []
    real = worker.micro_loss

    def recording(mb, denominators):
        out = real(mb, denominators)
        seen.append({k: float(v) for k, v in out.extremes.items()})
        return out

    worker.micro_loss = recording
    metrics = worker.update_policy(_distil_batch()).metrics
    assert len(seen) == 4  # 2 mini-batches x 2 micro-batches
    for key, pick in (("actor/distillation/loss_min", min), ("actor/distillation/loss_max", max)):
        per_mini = [pick(s[key] for s in seen[:2]), pick(s[key] for s in seen[2:])]
        assert abs(metrics[key] - sum(per_mini) / 2) < 1e-6, key
    assert {"actor/distillation/loss", "actor/distillation/abs_loss", "actor/pg_loss"} <= set(metrics)


def test_without_task_rewards_the_advantages_do_not_matter(tiny_model_dir, tmp_path):
    """use_task_rewards=False: verl zeroes the policy loss, so changing the task advantages changes nothing."""
    weights = []
    for i, scale in enumerate((1.0, -3.0)):
        worker = _worker(tiny_model_dir, tmp_path / str(i), "distillation.distillation_loss.use_task_rewards=False")
        batch = _distil_batch()
        batch = batch.union(Batch({"advantages": batch["advantages"] * scale}))
        worker.update_policy(batch)
        weights.append({k: v.detach().clone() for k, v in worker.model.state_dict().items()})
    for name in weights[0]:
        torch.testing.assert_close(weights[0][name], weights[1][name], rtol=0, atol=0, msg=name)


def test_topk_update_reads_the_teachers_top_k(tiny_model_dir, tmp_path):
    """forward_kl_topk: the update's forward gathers the student's log-probs at the teacher's top-k ids; a teacher
    whose top-k log-probs are the student's own (at its own ids) gives a near-zero loss (exactly zero before the
    first mini-batch's optimizer step) and a high overlap (the random model's near-ties at the k-th place move after
    that step); the same log-probs at other ids a far larger loss."""
    k = 3
    worker = _worker(tiny_model_dir, tmp_path, "distillation.distillation_loss.loss_mode=forward_kl_topk",
                     f"distillation.distillation_loss.topk={k}")
    batch = _distil_batch()
    options = logprob_options(worker.model_cfg, compute_entropy=False)
    options.topk = k
    with torch.no_grad():
        stats, _ = worker.engine.forward_logprob_stats(batch, worker.run_settings.logprob_temperature, options)
    same = batch.union(Batch({"teacher_topk_logprobs": stats["topk_logprobs"], "teacher_topk_ids": stats["topk_ids"]}))
    metrics = worker.update_policy(same).metrics
    assert abs(metrics["actor/distillation/loss"]) < 1e-3
    assert metrics["actor/distillation/overlap_ratio"] > 0.8
    for key in ("student_mass", "student_mass_min", "student_mass_max", "teacher_mass", "overlap_token_advantage"):
        assert f"actor/distillation/{key}" in metrics, key
    shifted = (stats["topk_ids"] + 1) % worker.model.config.vocab_size  # other ids, the same teacher log-probs
    other = batch.union(Batch({"teacher_topk_logprobs": stats["topk_logprobs"], "teacher_topk_ids": shifted}))
    far = _worker(tiny_model_dir, tmp_path / "other", "distillation.distillation_loss.loss_mode=forward_kl_topk",
                  f"distillation.distillation_loss.topk={k}").update_policy(other).metrics["actor/distillation/loss"]
    assert far > 100 * abs(metrics["actor/distillation/loss"]) and far > 1e-2, far
