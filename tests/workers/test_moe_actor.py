"""An MoE actor: router metrics and the auxiliary loss in its update; router replay of the hf rollout's experts
(R3) and of its own log-prob pass (R2)."""

from __future__ import annotations

import pytest
import torch

from npu_rl.models import moe
from npu_rl.protocol import Batch
from npu_rl.rollout.base import SamplingParams
from npu_rl.rollout.hf import HFRolloutEngine
from tests.models.lora.common import actor_batch, actor_config, actor_worker
from tests.models.moe_models import save_tiny_moe


def _worker(tmp_path, *extra, kind="qwen3_moe", **model_overrides):
    folder = save_tiny_moe(str(tmp_path / "model"), kind, **model_overrides)
    worker = actor_worker(actor_config(folder, str(tmp_path / "out"), *extra))
    worker.init_model(total_training_steps=2)
    return worker


def test_update_reports_router_load_and_adds_the_aux_loss(tmp_path):
    base = ("actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.optim.lr=0")
    without = _worker(tmp_path / "a", *base)
    metrics = without.update_policy(actor_batch()).metrics
    for key in ("tokens_per_expert_max", "tokens_per_expert_mean", "max_over_mean", "max_over_mean_worst",
                "dead_expert_share", "aux_loss"):
        assert f"actor/moe/{key}" in metrics, key
    # 8 rows x <= 18 tokens x top-2 over 8 experts: the mean over experts is tokens * 2 / 8 per micro-batch
    assert metrics["actor/moe/tokens_per_expert_max"] >= metrics["actor/moe/tokens_per_expert_mean"] > 0
    assert 0 <= metrics["actor/moe/dead_expert_share"] < 1 and metrics["actor/moe/max_over_mean"] >= 1
    # output_router_logits=True adds router_aux_loss_coef * aux to the loss: a larger gradient norm (lr=0: the
    # same weights, the same batch, so only the loss differs)
    with_aux = _worker(tmp_path / "b", *base, "+actor_rollout_ref.model.override_config.output_router_logits=True",
                       "+actor_rollout_ref.model.override_config.router_aux_loss_coef=10.0")
    aux_metrics = with_aux.update_policy(actor_batch()).metrics
    assert aux_metrics["actor/moe/aux_loss"] == metrics["actor/moe/aux_loss"]
    assert aux_metrics["actor/pg_loss"] == metrics["actor/pg_loss"]
    assert aux_metrics["actor/grad_norm"] > metrics["actor/grad_norm"] * 1.01


def _rollout(worker, prompts: Batch) -> Batch:
    engine = HFRolloutEngine(worker.generation_module, pad_token_id=0, record_routing=True)
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=6, stop_token_ids=[2], return_logprobs=True)
    torch.manual_seed(0)
    return engine.generate(prompts, sampling).batch


def _prompts() -> Batch:
    batch = actor_batch(rows=3, prompt=12, response=6)
    return Batch({k: batch[k][:, :12] for k in ("input_ids", "attention_mask", "position_ids")})


@pytest.mark.parametrize("remove_padding", [False, True])
def test_r3_replays_the_hf_rollouts_experts_and_reproduces_its_logprobs(tmp_path, remove_padding):
    worker = _worker(tmp_path, "actor_rollout_ref.actor.router_replay.mode=R3",
                     "actor_rollout_ref.rollout.enable_rollout_routing_replay=True",
                     f"actor_rollout_ref.model.use_remove_padding={remove_padding}")
    batch = _rollout(worker, _prompts())
    routed = batch["routed_experts"]
    assert routed.shape == (6, 18, 2, 2) and routed.dtype == torch.int16
    assert (routed[:, :12] >= 0).all()  # the prompt (prefill) is always routed
    mask = batch["response_mask"].bool()
    old = worker.compute_logprobs(batch)["old_logprobs"]
    # equal weights, replayed experts: the training forward gives the rollout's log-probs
    torch.testing.assert_close(old[mask], batch["rollout_logprobs"][mask], rtol=1e-5, atol=1e-5)
    # the replay is what the forward used: other experts give other log-probs
    shifted = batch.union(Batch({"routed_experts": torch.where(routed >= 0, (routed + 1) % 8, routed)}))
    other = worker.compute_logprobs(shifted)["old_logprobs"]
    assert (other[mask] - old[mask]).abs().max() > 1e-3
    # the update sees the recorded routing: same weights, so the router agrees with the rollout everywhere
    update = worker.update_policy(batch.union(_training_fields(batch))).metrics
    assert update["actor/moe/routing_mismatch"] == 0.0


def test_mismatch_is_reported_without_replay_when_training_routes_differently(tmp_path):
    worker = _worker(tmp_path, "actor_rollout_ref.rollout.enable_rollout_routing_replay=True")
    batch = _rollout(worker, _prompts())
    with torch.no_grad():  # the training weights move away from the rollout's: some tokens change experts
        for router in worker.engine.router_hooks.modules:
            router.weight.add_(torch.randn_like(router.weight) * 0.5)
    metrics = worker.update_policy(batch.union(_training_fields(batch))).metrics
    assert 0 < metrics["actor/moe/routing_mismatch"] < 1


def test_r2_records_in_the_logprob_pass_and_replays_in_the_update(tmp_path):
    worker = _worker(tmp_path, "actor_rollout_ref.actor.router_replay.mode=R2", kind="deepseek_v3")
    batch = actor_batch(rows=4)
    out = worker.compute_logprobs(batch)
    routed = out["routed_experts"]  # [4, 18, 2 MoE layers (layer 0 is dense), 2]
    assert routed.shape == (4, 18, 2, 2)
    real = batch["attention_mask"].bool()
    assert (routed[real] >= 0).all() and (routed[~real] == -1).all()
    metrics = worker.update_policy(batch.union(Batch({"routed_experts": routed}))).metrics
    assert metrics["actor/moe/routing_mismatch"] == 0.0  # first update, old weights: the router agrees


def _training_fields(batch: Batch) -> Batch:
    mask = batch["response_mask"].float()
    rows, width = mask.shape
    g = torch.Generator().manual_seed(3)
    return Batch({"old_logprobs": batch["rollout_logprobs"], "ref_logprobs": batch["rollout_logprobs"],
                  "advantages": torch.randn(rows, width, generator=g) * mask})


@pytest.mark.parametrize("param_dtype", ["fp32", "bf16"])  # bf16: an fp32 master and a bf16 compute copy
def test_bias_update_follows_the_updates_load(tmp_path, param_dtype):
    worker = _worker(tmp_path, "actor_rollout_ref.actor.moe_router_bias_update_rate=0.01",
                     f"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype={param_dtype}",
                     kind="deepseek_v3")
    routers = moe.routers(worker.engine.model)
    before = torch.stack([r.e_score_correction_bias.clone() for r in routers])
    loads = []
    real = worker._update_router_bias

    def recording(stepped):
        loads.append(worker._step_load.clone())
        return real(stepped)

    worker._update_router_bias = recording
    metrics = worker.update_policy(actor_batch()).metrics
    moved = torch.stack([r.e_score_correction_bias for r in routers]) - before
    # 8 rows / ppo_mini_batch_size 2 x n 4 = one mini-batch: one step, one move by the sign of (mean - load)
    assert len(loads) == 1
    expected = 0.01 * torch.sign(loads[0].mean(dim=-1, keepdim=True) - loads[0])
    torch.testing.assert_close(moved, expected)
    assert "actor/moe/correction_bias_abs_mean" in metrics
    # the compute copy routes with the same bias as the master
    assert worker.engine.runner.has_master_copy == (param_dtype == "bf16")
    for master, compute in zip(routers, moe.routers(worker.engine.compute_model)):
        torch.testing.assert_close(compute.e_score_correction_bias.float(), master.e_score_correction_bias,
                                   rtol=0, atol=2e-3)  # bf16 holds the compute copy's bias to ~3 digits


def test_bias_update_on_a_model_without_a_bias_is_refused(tmp_path):
    with pytest.raises(ValueError, match="moe_router_bias_update_rate=0.01: Qwen3MoeForCausalLM has no routing bias"):
        _worker(tmp_path, "actor_rollout_ref.actor.moe_router_bias_update_rate=0.01")
