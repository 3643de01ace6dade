"""LoRA under FSDP2 on 2 gloo ranks (dp=2, and Ulysses sp=2), packed (remove-padding) with gradient checkpointing:
the same adapter, log-probs, reference log-probs and merged weights as one process (fp32; float32 reductions in
another order)."""

from __future__ import annotations

import pytest
import torch

from tests.models.lora.common import LORA, actor_batch, actor_config, actor_worker

pytestmark = pytest.mark.dist
TOL = {"rtol": 1e-5, "atol": 1e-5}
SETUP = [*LORA, "actor_rollout_ref.model.enable_gradient_checkpointing=True",
         "actor_rollout_ref.model.use_remove_padding=True"]


def lora_actor_job(model_dir: str, out_dir: str, extra: list[str]) -> dict:
    import torch.distributed as dist

    from npu_rl.models.lora import adapter_tensors, merged_named_weights
    worker = actor_worker(actor_config(model_dir, out_dir, *SETUP, *extra))
    worker.init_model(total_training_steps=2)
    batch = actor_batch()
    runner = worker.engine.runner
    if runner.dp_size > 1:  # this rank's rows (DP_SPLIT); with sp every rank of the group sees all rows
        rank, world = dist.get_rank(), dist.get_world_size()
        batch = batch.index(slice(rank * len(batch) // world, (rank + 1) * len(batch) // world))
    worker.update_policy(batch)
    out = {"logprobs": worker.compute_logprobs(batch)["old_logprobs"],
           "ref": worker.compute_ref_logprobs(batch)["ref_logprobs"],
           "adapter": {k: v.clone() for k, v in adapter_tensors(worker.model)},
           "merged": {k: v.clone() for k, v in merged_named_weights(worker.model)},
           "sharded": type(worker.model).__name__}
    return out


@pytest.mark.parametrize("layout", ["dp2", pytest.param("sp2", marks=pytest.mark.slow)])
def test_lora_fsdp2_two_ranks_match_one_process(layout, dist_pool2, tiny_model_dir, tmp_path):
    single = lora_actor_job(tiny_model_dir, str(tmp_path / "one"), [])
    extra = ["trainer.n_gpus_per_node=2"]
    if layout == "sp2":
        extra.append("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2")
    results = dist_pool2.run(lora_actor_job, tiny_model_dir, str(tmp_path / "two"), extra)
    assert results[0]["sharded"].startswith("FSDP")
    for key in ("adapter", "merged"):
        assert results[0][key].keys() == single[key].keys()
        for name, value in single[key].items():
            torch.testing.assert_close(results[0][key][name], value, **TOL, msg=f"{key} {name}")
            torch.testing.assert_close(results[1][key][name], value, **TOL, msg=f"{key} {name} (rank 1)")
    for key in ("logprobs", "ref"):
        got = torch.cat([r[key] for r in results]) if layout == "dp2" else results[0][key]
        torch.testing.assert_close(got, single[key], **TOL, msg=key)
