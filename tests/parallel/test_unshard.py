"""The hf rollout on an FSDP2-sharded actor: weights gathered once, ranks decode independently, outputs equal the
unsharded model's (2 gloo ranks, float32, greedy, so equality is exact up to summation order: tolerance 0 on token
ids, default float32 tolerances on log-probs)."""

from __future__ import annotations

import pytest
import torch

from tests.parallel.common import rank_and_world, tiny_model

pytestmark = pytest.mark.dist
PAD, EOS = 0, 2


def _prompts(rank: int):
    from npu_rl.protocol import Batch

    gen = torch.Generator().manual_seed(10 + rank)
    ids = torch.randint(3, 128, (3, 7), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    ids[0, :3] = PAD
    return Batch({"input_ids": ids, "attention_mask": mask}, {"uid": [f"r{rank}p{i}" for i in range(3)]}, {})


def _sampling(max_new_tokens: int):
    from npu_rl.rollout import SamplingParams

    return SamplingParams(n=2, do_sample=False, max_new_tokens=max_new_tokens, stop_token_ids=[EOS],
                          return_logprobs=True)


def generate_job(gather: bool) -> dict:
    from npu_rl.parallel import FSDPSettings, apply_fsdp2, build_mesh
    from npu_rl.parallel.unshard import is_sharded
    from npu_rl.rollout.hf import HFRolloutEngine
    from torch.distributed.tensor import DTensor

    rank, world_size = rank_and_world()
    model = apply_fsdp2(tiny_model(), build_mesh(), FSDPSettings())
    engine = HFRolloutEngine(model, PAD, gather_full_weights=gather)
    # Different lengths per rank: if the decode loop still needed collectives, the ranks would deadlock or fail.
    new_tokens = 6 + 3 * rank if gather else 6
    generated = engine.generate(_prompts(rank), _sampling(new_tokens))
    out = generated.batch
    after = {
        "sharded": is_sharded(model) and all(isinstance(p, DTensor) for p in model.parameters()),
        "local_numel": sum(p.to_local().numel() for p in model.parameters()),
        "full_numel": sum(p.numel() for p in model.parameters()),
    }
    # A training forward + backward still works (sharding restored, reshard_after_forward restored).
    ids = torch.randint(3, 128, (2, 5), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids).logits.float().mean().backward()
    after["grads"] = all(p.grad is not None for p in model.parameters())
    after["twin"] = engine._plain_view is not None  # decoded on the hook-free twin
    return {"responses": out["responses"], "logprobs": out["rollout_logprobs"], "metrics": generated.metrics,
            "new_tokens": new_tokens, **after}


def test_generation_on_sharded_model_equals_unsharded(dist_pool2):
    from npu_rl.rollout.hf import HFRolloutEngine

    results = dist_pool2.run(generate_job, True)
    reference = tiny_model()
    for rank, result in enumerate(results):
        expected = HFRolloutEngine(reference, PAD).generate(_prompts(rank), _sampling(result["new_tokens"])).batch
        assert torch.equal(result["responses"], expected["responses"]), rank
        torch.testing.assert_close(result["logprobs"], expected["rollout_logprobs"])
        metrics = result["metrics"]
        full_bytes = sum(p.numel() * 4 for p in reference.parameters())
        assert metrics["rollout/unshard_gathered_gb"] == pytest.approx(full_bytes / 1024**3)
        assert metrics["timing_s/rollout_unshard"] >= 0 and metrics["timing_s/rollout_reshard"] >= 0
        assert result["sharded"] and result["local_numel"] < result["full_numel"] and result["grads"]
        assert result["twin"]


def test_per_token_gather_path_still_matches(dist_pool2):
    """gather_full_weights=False: the old synced per-token path, same tokens."""
    from npu_rl.rollout.hf import HFRolloutEngine

    results = dist_pool2.run(generate_job, False)
    reference = tiny_model()
    for rank, result in enumerate(results):
        expected = HFRolloutEngine(reference, PAD).generate(_prompts(rank), _sampling(result["new_tokens"])).batch
        assert torch.equal(result["responses"], expected["responses"]), rank
        assert not any("unshard" in key for key in result["metrics"])  # no gather: per-token all-gathers
        assert result["metrics"]["rollout/decode_compiled"] == 0.0


def test_unsharded_passes_plain_modules_through():
    from npu_rl.parallel.unshard import unsharded

    model = tiny_model()
    with unsharded(model) as stats:
        assert not stats.gathered
    assert stats.as_metrics() == {}


def test_plain_view_aliases_and_releases():
    from npu_rl.parallel.unshard import PlainView

    model = tiny_model().eval()
    view = PlainView(model)
    twin = view.bind(model)
    assert twin.model.embed_tokens.weight is model.model.embed_tokens.weight
    assert twin.lm_head.weight is twin.model.embed_tokens.weight  # tied stays tied
    ids = torch.randint(3, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(twin(input_ids=ids).logits, model(input_ids=ids).logits, atol=0, rtol=0)
    view.release()
    assert all(p.is_meta for p in twin.parameters()) and not any(p.is_meta for p in model.parameters())
