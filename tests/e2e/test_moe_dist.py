"""Router replay on 2 gloo ranks (FSDP2 dp=2, packed, gradient checkpointing): each rank's hf rollout records its
experts on the gathered twin of the sharded module, and the training forward replays them (R3)."""

from __future__ import annotations

import pytest
import torch


pytestmark = pytest.mark.dist


def r3_job(model_dir: str, out_dir: str) -> dict:
    import torch.distributed as dist

    from npu_rl.protocol import Batch
    from npu_rl.rollout.base import SamplingParams
    from npu_rl.rollout.hf import HFRolloutEngine
    from tests.models.lora.common import actor_batch, actor_config, actor_worker

    worker = actor_worker(actor_config(
        model_dir, out_dir, "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.router_replay.mode=R3",
        "actor_rollout_ref.rollout.enable_rollout_routing_replay=True", "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True", "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.optim.lr=0"))  # two mini-batches per rank: lr 0 keeps the rollout's weights for both
    worker.init_model(total_training_steps=2)
    rank = dist.get_rank()
    rows = actor_batch(rows=4, seed=rank)
    prompts = Batch({k: rows[k][:, :12] for k in ("input_ids", "attention_mask", "position_ids")})
    engine = HFRolloutEngine(worker.generation_module, pad_token_id=0, record_routing=True)
    torch.manual_seed(rank)
    batch = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=6, stop_token_ids=[2],
                                                    return_logprobs=True)).batch.to("cpu")
    old = worker.compute_logprobs(batch)["old_logprobs"]
    mask = batch["response_mask"].bool()
    routed = batch["routed_experts"]
    shifted = worker.compute_logprobs(batch.union(Batch({"routed_experts": torch.where(routed >= 0, (routed + 1) % 8,
                                                                                        routed)})))["old_logprobs"]
    fields = Batch({"old_logprobs": batch["rollout_logprobs"],
                    "advantages": torch.randn(mask.shape, generator=torch.Generator().manual_seed(rank)) * mask})
    metrics = worker.update_policy(batch.union(fields)).metrics
    return {"sharded": type(worker.model).__name__, "old": old[mask], "rollout": batch["rollout_logprobs"][mask],
            "shift": (shifted[mask] - old[mask]).abs().max().item(),
            "routed": batch["routed_experts"], "metrics": metrics}


def test_r3_on_two_fsdp2_ranks(dist_pool2, tmp_path):
    from tests.models.moe_models import save_tiny_moe

    folder = save_tiny_moe(str(tmp_path / "moe"))
    results = dist_pool2.run(r3_job, folder, str(tmp_path / "out"))
    for result in results:
        assert result["sharded"].startswith("FSDP")
        assert result["routed"].shape == (8, 18, 2, 2) and (result["routed"][:, :12] >= 0).all()
        torch.testing.assert_close(result["old"], result["rollout"], rtol=1e-5, atol=1e-5)
        assert result["shift"] > 1e-3  # the training forward uses the recorded experts
        # the update's forward (and its recompute in backward) replays the rollout's experts; same weights, so the
        # router agrees with them everywhere
        assert result["metrics"]["actor/moe/routing_mismatch"] == 0.0
