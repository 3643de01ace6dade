"""FSDP2 on 2 gloo ranks against one process: forward, backward, clipping, AdamW steps (float32).

Tolerances: losses and gradients atol=1e-6, rtol=1e-5 (the only difference is the summation order of the gradient
average); parameters after two AdamW steps atol=1e-6, rtol=1e-5.
"""

from __future__ import annotations

import pytest
import torch

from tests.parallel.common import full_grads, make_batch, rank_and_world, rank_loss, tiny_model, tiny_value_model

pytestmark = pytest.mark.dist
TOL = dict(atol=1e-6, rtol=1e-5)
NUM_STEPS = 2


def train(model, optimizer_step, rank: int, world_size: int, clip) -> dict:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    input_ids, mask = make_batch()
    losses, norms, grads = [], [], None
    for step in range(NUM_STEPS):
        loss = rank_loss(model, input_ids, mask, rank, world_size)
        loss.backward()
        norms.append(clip(model))
        if step == 0:
            grads = full_grads(model)
        optimizer_step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return {"losses": torch.stack(losses), "norms": torch.stack(norms), "grads": grads, "optimizer": optimizer}


def fsdp_job(settings_kwargs: dict, fsdp_size: int = -1, tie: bool = True, from_config=None) -> dict:
    from npu_rl.parallel import FSDPSettings, apply_fsdp2, apply_fsdp2_from_config, build_mesh, clip_grad_norm, \
        optimizer_step
    from npu_rl.parallel.weights import iter_full_parameters

    rank, world_size = rank_and_world()
    if from_config is not None:  # the trainer's entry point: settings and mesh from an fsdp_config node
        settings = FSDPSettings.from_config(from_config)
        model = apply_fsdp2_from_config(tiny_model(tie=tie), from_config)
        mesh = build_mesh(fsdp_size=from_config.fsdp_size)
    else:
        mesh = build_mesh(fsdp_size=fsdp_size)
        settings = FSDPSettings(**settings_kwargs)
        model = apply_fsdp2(tiny_model(tie=tie), mesh, settings)
    out = train(model, lambda opt: optimizer_step(opt, settings), rank, world_size,
                lambda m: clip_grad_norm(m, 1.0))
    states = [s for s in out.pop("optimizer").state.values()]
    torch.distributed.all_reduce(out["losses"], op=torch.distributed.ReduceOp.AVG)
    out["params"] = dict(iter_full_parameters(model))
    out["tied"] = model.lm_head.weight is model.model.embed_tokens.weight
    out["hsdp"] = mesh.is_hsdp
    out["exp_avg_device"] = {str(s["exp_avg"].device) for s in states}
    out["param_device"] = {str(p.to_local().device) for p in model.parameters()}
    return out


def reference(tie: bool = True) -> dict:
    model = tiny_model(tie=tie)
    out = train(model, lambda opt: opt.step(), 0, 1,
                lambda m: torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0))
    out.pop("optimizer")
    out["params"] = dict(model.state_dict())
    return out


@pytest.fixture(scope="module")
def ref_tied():
    return reference(tie=True)


def assert_matches(result: dict, ref: dict) -> None:
    # The global loss is the mean of the ranks' losses (all-reduced in the job).
    torch.testing.assert_close(result["losses"], ref["losses"], **TOL)
    torch.testing.assert_close(result["norms"], ref["norms"], **TOL)
    assert result["grads"].keys() == {k for k in ref["grads"]}
    for name, grad in ref["grads"].items():
        torch.testing.assert_close(result["grads"][name], grad, **TOL, msg=name)
    for name, value in result["params"].items():
        if name.endswith("k_proj.bias"):
            # Its gradient is exactly 0 in exact arithmetic (softmax ignores a shift shared by all keys); Adam
            # divides float noise of ~1e-9 by its own magnitude, so its update is +-lr at random in any two runs.
            continue
        torch.testing.assert_close(value, ref["params"][name], **TOL, msg=name)


@pytest.mark.parametrize("settings", [
    {},
    {"forward_prefetch": True, "reshard_after_forward": False},
], ids=["default", "prefetch_no_reshard"])
def test_fsdp2_two_ranks_equal_one_process(dist_pool2, ref_tied, settings):
    results = dist_pool2.run(fsdp_job, settings)
    for result in results:
        assert result["tied"]  # tied embeddings stay one parameter under FSDP2
        assert_matches(result, ref_tied)


def test_fsdp2_untied_embeddings(dist_pool2):
    result = dist_pool2.run(fsdp_job, {}, tie=False)[0]
    assert not result["tied"] and "lm_head.weight" in result["params"]
    assert_matches(result, reference(tie=False))


def test_hsdp_replicate_across_ranks(dist_pool2, ref_tied):
    result = dist_pool2.run(fsdp_job, {}, fsdp_size=1)[1]  # 2 ranks, shard groups of 1: pure replication
    assert result["hsdp"]
    assert_matches(result, ref_tied)


def test_param_and_optimizer_offload_paths_match(dist_pool2, ref_tied):
    results = dist_pool2.run(fsdp_job, {"optimizer_offload": True})
    assert results[0]["exp_avg_device"] == {"cpu"}  # states left on the host after the step
    assert_matches(results[0], ref_tied)
    results = dist_pool2.run(fsdp_job, {"param_offload": True, "optimizer_offload": True})
    assert results[1]["param_device"] == {"cpu"}
    assert_matches(results[1], ref_tied)


def test_apply_from_config_node(dist_pool2, ref_tied):
    from npu_rl.config.engine_schema import FSDPConfig, MixedPrecisionConfig

    cfg = FSDPConfig(fsdp_size=1, optimizer_offload=True, mixed_precision=MixedPrecisionConfig(param_dtype="fp32"))
    result = dist_pool2.run(fsdp_job, {}, from_config=cfg)[0]
    assert result["hsdp"] and result["exp_avg_device"] == {"cpu"}
    assert_matches(result, ref_tied)


def test_mixed_precision_bf16_compute_keeps_fp32_master(dist_pool2, ref_tied):
    result = dist_pool2.run(fsdp_job, {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32})[0]
    assert {v.dtype for v in result["params"].values()} == {torch.float32}
    # bf16 compute: the loss agrees to bf16 precision only (8 mantissa bits -> ~1e-2 relative here).
    torch.testing.assert_close(result["losses"][0], ref_tied["losses"][0], atol=0, rtol=2e-2)


def test_settings_from_config():
    from npu_rl.config.engine_schema import FSDPConfig, MixedPrecisionConfig, RefFSDPConfig
    from npu_rl.parallel import FSDPSettings

    cfg = FSDPConfig(param_offload=True, forward_prefetch=True)
    settings = FSDPSettings.from_config(cfg)
    assert settings.param_dtype == torch.bfloat16 and settings.reduce_dtype == torch.float32
    assert settings.param_offload and settings.forward_prefetch and not settings.optimizer_offload
    # the reference's optimizer_offload / offload_policy / fsdp_size are verl keys with no effect here
    ref = RefFSDPConfig(optimizer_offload=True, offload_policy=True, fsdp_size=2)
    ref_settings = FSDPSettings.from_config(ref)
    assert not ref_settings.optimizer_offload and not ref_settings.param_offload
    from npu_rl.parallel.fsdp import mesh_fsdp_size

    assert mesh_fsdp_size(ref) == -1 and mesh_fsdp_size(FSDPConfig(fsdp_size=2)) == 2
    assert FSDPSettings.from_config(FSDPConfig(offload_policy=True)).param_offload
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        FSDPSettings.from_config(FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype="fp8")))


def value_loss(model, rank: int, world_size: int) -> torch.Tensor:
    input_ids, mask = make_batch()
    shards = list(zip(input_ids.chunk(2), mask.chunk(2)))
    losses = []
    for k, (ids, m) in enumerate(shards):
        if k % world_size == rank:
            values = model(input_ids=ids, attention_mask=m).logits[..., 0]  # [B, T]
            losses.append(((values - 1.0) ** 2 * m).sum() / m.sum())
    return torch.stack(losses).sum() * world_size / 2


def value_model_job() -> dict:
    from npu_rl.parallel import FSDPSettings, apply_fsdp2, build_mesh

    rank, world_size = rank_and_world()
    model = apply_fsdp2(tiny_value_model(), build_mesh(), FSDPSettings())
    value_loss(model, rank, world_size).backward()
    return full_grads(model)


def test_fsdp2_value_model(dist_pool2):
    grads = dist_pool2.run(value_model_job)[0]
    model = tiny_value_model()
    value_loss(model, 0, 1).backward()
    assert grads.keys() == {n for n, _ in model.named_parameters()}
    for name, param in model.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, **TOL, msg=name)
