"""Expert parallelism (npu_rl/parallel/expert_parallel.py) on 2 gloo ranks, EP=2, against the one-process model.

Tiny random Qwen3-MoE (8 experts, top-2, softmax routing) and DeepSeek-V3 (8 routed experts in 2 groups, top-2,
sigmoid routing with the correction bias, a shared expert, a dense first layer, MLA) in float32. Each rank holds 4
experts per MoE layer; the tokens of both ranks reach them by all-to-all.

Tolerances: logits and gradients rtol=1e-5, atol=1e-6 (the one difference is the order of floating-point sums:
the expert outputs are weighted after the combine, and FSDP averages the gradients over 2 ranks).
"""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, DeepseekV3Config, Qwen2Config, Qwen3MoeConfig

from npu_rl.config.errors import ConfigError
from npu_rl.config.loader import load_config
from npu_rl.config.engine_schema import FSDPConfig, MixedPrecisionConfig
from npu_rl.models.loader import load_causal_lm
from npu_rl.parallel import (
    FSDPSettings,
    apply_fsdp2,
    build_mesh,
    clip_grad_norm,
    iter_full_parameters,
    load_checkpoint,
    merge_checkpoint,
    save_checkpoint,
    use_varlen_attention,
)
from npu_rl.parallel.expert_parallel import IMPLEMENTATION, check_expert_parallel, experts_modules, num_experts_of
from npu_rl.parallel.mesh import check_parallel_sizes
from npu_rl.parallel.unshard import PlainView, unsharded
from npu_rl.trainer.preflight import check
from npu_rl.workers.model_runner import ModelRunner, sharded_load_folder
from tests.parallel.common import full_grads, make_batch, mean_nll, rank_and_world, rank_loss
from tests.parallel.dist_pool import DistPool
from tests.parallel.test_ulysses import TOL as ULYSSES_TOL
from tests.parallel.test_ulysses import loss_of, packed_logprobs

pytestmark = pytest.mark.dist
TOL = dict(atol=1e-6, rtol=1e-5)
NUM_EXPERTS = 8


def qwen3_moe_config():
    return Qwen3MoeConfig(vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                          num_experts=NUM_EXPERTS, num_experts_per_tok=2, norm_topk_prob=True,
                          max_position_embeddings=256, tie_word_embeddings=False, pad_token_id=0, eos_token_id=2,
                          bos_token_id=None)


def deepseek_v3_config():
    return DeepseekV3Config(vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                            num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
                            num_key_value_heads=4, n_routed_experts=NUM_EXPERTS, n_shared_experts=1,
                            num_experts_per_tok=2, n_group=2, topk_group=1, routed_scaling_factor=2.5,
                            q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                            v_head_dim=8, max_position_embeddings=256, tie_word_embeddings=False, pad_token_id=0,
                            eos_token_id=2, bos_token_id=None)


CONFIGS = {"qwen3_moe": qwen3_moe_config, "deepseek_v3": deepseek_v3_config}


def tiny_moe(kind: str, seed: int = 0, bias: str = "random"):
    """A random model, the same on every rank (seeded); DeepSeek-V3's router drawn too. ``bias``: DeepSeek-V3's
    ``e_score_correction_bias``, a buffer no initialiser draws: "random" (small values, so it changes the choice of experts) or "starve"
    (experts 4-7, the second rank's, never chosen: that rank receives no token)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(CONFIGS[kind]()).float()
    for module in model.modules():
        if type(module).__name__.endswith("TopkRouter"):  # DeepSeek-V3's init leaves it at zero: all tokens tie
            torch.nn.init.normal_(module.weight, std=0.2)
        if hasattr(module, "e_score_correction_bias"):
            if bias == "starve":
                module.e_score_correction_bias[NUM_EXPERTS // 2:] = -100.0
            else:
                module.e_score_correction_bias.copy_(torch.randn(NUM_EXPERTS) * 0.1)
    return model


def logits_of(model, input_ids, mask) -> torch.Tensor:
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False).logits


def routed_counts(model, input_ids, mask) -> torch.Tensor:
    """How many (token, k) pairs each expert of each MoE layer received in one forward: [layers, E]."""
    counts = []

    def hook(module, args, _output):
        counts.append(torch.bincount(args[1].reshape(-1), minlength=NUM_EXPERTS))

    experts = [m for m in model.modules() if type(m).__name__.endswith("Experts")]
    handles = [m.register_forward_hook(hook) for m in experts]
    logits_of(model, input_ids, mask)
    for handle in handles:
        handle.remove()
    return torch.stack(counts)


# ---------------------------------------------------------------------------------------------- on the ranks
def ep_job(kind: str, bias: str = "random", checkpointing: bool = False) -> dict:
    rank, world_size = rank_and_world()
    model = tiny_moe(kind, bias=bias)
    if checkpointing:  # the config's default: the backward recomputes each layer, all-to-alls included
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    input_ids, mask = make_batch()
    counts = routed_counts(model, input_ids, mask)  # before the split: routing of the full batch
    mesh = build_mesh(ep_size=2)
    model = apply_fsdp2(model, mesh, FSDPSettings())
    experts = [m for m in model.modules() if type(m).__name__.endswith("Experts")]
    gate_up = experts[0].gate_up_proj
    logits = logits_of(model, input_ids, mask)
    rank_loss(model, input_ids, mask, rank, world_size).backward()
    return {"logits": logits, "grads": full_grads(model), "counts": counts, "mesh": repr(mesh),
            "implementation": {m.config._experts_implementation for m in experts},
            "model_implementation": model.config._experts_implementation,
            "placements": [repr(p) for p in gate_up.placements] if isinstance(gate_up, DTensor) else None,
            "local_shape": tuple(gate_up.to_local().shape)}


def reference(kind: str, bias: str = "random") -> dict:
    model = tiny_moe(kind, bias=bias)
    input_ids, mask = make_batch()
    logits = logits_of(model, input_ids, mask)
    rank_loss(model, input_ids, mask, 0, 1).backward()
    return {"logits": logits, "grads": full_grads(model), "implementation": model.config._experts_implementation}


def assert_parity(results: list[dict], ref: dict) -> None:
    for result in results:
        torch.testing.assert_close(result["logits"], ref["logits"], **TOL)
        assert result["grads"].keys() == ref["grads"].keys()
        for name, grad in ref["grads"].items():
            torch.testing.assert_close(result["grads"][name], grad, **TOL, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("kind", ["qwen3_moe", "deepseek_v3"])
def test_ep2_logits_and_gradients_equal_one_process(dist_pool2, kind):
    results = dist_pool2.run(ep_job, kind)
    ref = reference(kind)
    assert_parity(results, ref)
    first = results[0]
    assert first["implementation"] == {IMPLEMENTATION}
    assert first["model_implementation"] == ref["implementation"]  # the model's own config is left as it was
    assert "ep=2" in first["mesh"]
    # [E, 2I, H] = [8, 32, 32]: 4 experts per rank; FSDP over the 1-rank efsdp mesh keeps them whole
    assert first["local_shape"] == (4, 32, 32)
    assert first["placements"] == ["Shard(dim=1)", "Shard(dim=0)"]
    # the parity covers a real exchange: both ranks' experts receive tokens in every MoE layer
    counts = first["counts"]
    assert (counts[:, :4].sum(1) > 0).all() and (counts[:, 4:].sum(1) > 0).all()
    # and expert gradients that are not zero on both halves
    name = next(n for n in ref["grads"] if n.endswith("experts.gate_up_proj"))
    assert ref["grads"][name][:4].abs().sum() > 0 and ref["grads"][name][4:].abs().sum() > 0


def test_ep2_with_gradient_checkpointing(dist_pool2):
    results = dist_pool2.run(ep_job, "qwen3_moe", "random", True)
    assert_parity(results, reference("qwen3_moe"))


def test_ep2_when_one_rank_receives_no_token(dist_pool2):
    """DeepSeek-V3 with the correction bias steering every token to the first group (experts 0-3): the second
    rank's experts receive nothing, its all-to-all sends and receives zero rows, and the gradients still match."""
    results = dist_pool2.run(ep_job, "deepseek_v3", "starve")
    ref = reference("deepseek_v3", "starve")
    assert (results[0]["counts"][:, 4:] == 0).all()
    assert_parity(results, ref)
    name = next(n for n in ref["grads"] if n.endswith("experts.gate_up_proj"))
    assert results[0]["grads"][name][4:].abs().sum() == 0 and results[0]["grads"][name][:4].abs().sum() > 0


def train_steps(model, clip, rank: int, world_size: int, num_steps: int = 2) -> dict:
    """Two AdamW steps with gradient clipping at 0.05 (below the norm, so clipping scales every gradient)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    input_ids, mask = make_batch()
    norms = []
    for _ in range(num_steps):
        rank_loss(model, input_ids, mask, rank, world_size).backward()
        norms.append(clip(model))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {"norms": torch.stack(norms)}


def ep_train_job(kind: str) -> dict:
    rank, world_size = rank_and_world()
    model = apply_fsdp2(tiny_moe(kind), build_mesh(ep_size=2), FSDPSettings())
    out = train_steps(model, lambda m: clip_grad_norm(m, 0.05), rank, world_size)
    return {**out, "params": _full(model)}


@pytest.mark.parametrize("kind", ["qwen3_moe", "deepseek_v3"])
def test_ep2_clipped_adamw_steps_equal_one_process(dist_pool2, kind):
    """The gradient norm spans two meshes (the experts' efsdp x ep, the rest's fsdp): one global norm, and two
    clipped AdamW steps land on the one-process weights."""
    results = dist_pool2.run(ep_train_job, kind)
    model = tiny_moe(kind)
    ref = train_steps(model, lambda m: torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05), 0, 1)
    assert (ref["norms"] > 0.05).all()
    for result in results:
        torch.testing.assert_close(result["norms"], ref["norms"], **TOL)
        assert result["params"].keys() == model.state_dict().keys()  # parameters and persistent buffers
        # Adam divides each gradient by its own root mean square: where a gradient is near eps (1e-8) its rounding
        # moves the weight by up to ~lr x 1e-4 (one of 8,192 elements, 1.4e-6 here with transformers 5.19), so the
        # weights get an absolute tolerance of lr x 1e-3; the norms are held to TOL (the gradients: the tests above)
        for name, value in model.state_dict().items():
            torch.testing.assert_close(result["params"][name], value, rtol=TOL["rtol"], atol=1e-5,
                                       msg=lambda m: f"{name}: {m}")


def ulysses_ep_job(kind: str) -> dict:
    mesh = build_mesh(sp_size=2, ep_size=2)  # dp=1: both ranks hold the same rows, half of the tokens each
    model = apply_fsdp2(use_varlen_attention(tiny_moe(kind)), mesh, FSDPSettings())
    input_ids, mask = make_batch(rows=3, seq_len=11)
    logprobs = packed_logprobs(model, input_ids, mask, sp_group=mesh.sp_group)
    loss_of(logprobs, mask)[0].backward()
    return {"logprobs": logprobs.detach(), "grads": full_grads(model)}


@pytest.mark.parametrize("kind", ["qwen3_moe", "deepseek_v3"])
def test_ulysses_sp2_with_ep2_equals_one_process(dist_pool2, kind):
    """Remove-padding + Ulysses (sp=2) and EP=2 on the same 2 ranks: each rank routes its half of the packed
    tokens to both ranks' experts. Tolerances of test_ulysses (atol=1e-5, rtol=1e-4: attention split over heads)."""
    model = use_varlen_attention(tiny_moe(kind))
    input_ids, mask = make_batch(rows=3, seq_len=11)
    logprobs = packed_logprobs(model, input_ids, mask)
    loss_of(logprobs, mask)[0].backward()
    grads = full_grads(model)
    for result in dist_pool2.run(ulysses_ep_job, kind):
        torch.testing.assert_close(result["logprobs"], logprobs.detach(), **ULYSSES_TOL)
        assert result["grads"].keys() == grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(result["grads"][name], grad, **ULYSSES_TOL, msg=name)


def generate_view_job(kind: str) -> dict:
    """The HF rollout's path on a sharded actor: full weights gathered once, a hook-free twin decodes. With EP the
    twin gets every expert, so the ranks run different numbers of forwards without any collective."""
    rank, _ = rank_and_world()
    model = apply_fsdp2(tiny_moe(kind), build_mesh(ep_size=2), FSDPSettings())
    input_ids, mask = make_batch()
    view = PlainView(model)
    with unsharded(model):
        twin = view.bind(model)
        twin_logits = [logits_of(twin, input_ids, mask) for _ in range(1 + 2 * rank)]  # 1 forward on rank 0, 3 on 1
        view.release()
    return {"twin": twin_logits, "after": logits_of(model, input_ids, mask)}


@pytest.mark.parametrize("kind", ["qwen3_moe", "deepseek_v3"])
def test_rollout_twin_holds_every_expert(dist_pool2, kind):
    ref = logits_of(tiny_moe(kind), *make_batch())
    results = dist_pool2.run(generate_view_job, kind)
    assert [len(r["twin"]) for r in results] == [1, 3]
    for result in results:
        for logits in result["twin"]:
            torch.testing.assert_close(logits, ref, **TOL)
        torch.testing.assert_close(result["after"], ref, **TOL)  # the EP model runs as before afterwards


@pytest.fixture(scope="module")
def dist_pool4():
    pool = DistPool(4)
    yield pool
    pool.close()


def quarter_loss(model, input_ids, mask, rank: int, world_size: int) -> torch.Tensor:
    """4 shards of the batch (one row each) over ``world_size`` ranks, scaled so FSDP's average is the mean."""
    shards = list(zip(input_ids.chunk(4), mask.chunk(4)))
    mine = [mean_nll(model, ids, m) for k, (ids, m) in enumerate(shards) if k % world_size == rank]
    return torch.stack(mine).sum() * world_size / 4


def ep_train_job4(kind: str, ep_size: int) -> dict:
    rank, world_size = rank_and_world()
    mesh = build_mesh(ep_size=ep_size)
    model = apply_fsdp2(tiny_moe(kind), mesh, FSDPSettings())
    gate_up = experts_modules(model)[0].gate_up_proj
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    input_ids, mask = make_batch()
    quarter_loss(model, input_ids, mask, rank, world_size).backward()
    grads = full_grads(model)
    norm = clip_grad_norm(model, 0.05)
    optimizer.step()
    return {"grads": grads, "norm": norm, "params": _full(model), "efsdp": mesh.efsdp_mesh.size(),
            "local_shape": tuple(gate_up.to_local().shape)}


# ---------------------------------------------------------------------------------------------- validation
def test_ep_size_must_divide_experts_and_devices():
    config = qwen3_moe_config()
    assert num_experts_of(config) == NUM_EXPERTS and num_experts_of(deepseek_v3_config()) == NUM_EXPERTS
    check_expert_parallel(config, 4)
    with pytest.raises(ValueError, match=r"fsdp_config.expert_parallel_size=3 must divide the model's 8 experts"):
        check_expert_parallel(config, 3)

    with pytest.raises(ValueError, match=r"expert_parallel_size=2: the model .* has no routed experts"):
        check_expert_parallel(Qwen2Config(), 2)
    assert check_parallel_sizes(4, ep_size=2) == (4, 4)
    with pytest.raises(ValueError, match=r"fsdp_config.expert_parallel_size=3 must be >= 1 and divide the number "
                                         r"of devices \(4\)"):
        check_parallel_sizes(4, ep_size=3)
    with pytest.raises(ValueError, match=r"expert_parallel_size=2 with fsdp_config.fsdp_size=2 \(HSDP\)"):
        check_parallel_sizes(4, fsdp_size=2, ep_size=2)


@pytest.mark.parametrize("overrides, message", [
    (["actor_rollout_ref.actor.fsdp_config.expert_parallel_size=3"],
     "actor_rollout_ref.actor.fsdp_config.expert_parallel_size=3 must divide the number of devices (4)"),
    (["actor_rollout_ref.actor.fsdp_config.expert_parallel_size=2", "actor_rollout_ref.actor.fsdp_config.fsdp_size=2"],
     "actor_rollout_ref.actor.fsdp_config.expert_parallel_size=2 with fsdp_size=2 (HSDP) is not supported"),
    (["critic.model.fsdp_config.expert_parallel_size=8", "algorithm.adv_estimator=gae"],
     "critic.model.fsdp_config.expert_parallel_size=8 must divide the number of devices (4)"),
])
def test_config_validation_names_the_key(overrides, message):
    small = ["trainer.n_gpus_per_node=4", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
             "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "algorithm.adv_estimator=grpo"]
    check(load_config(small + ["actor_rollout_ref.actor.fsdp_config.expert_parallel_size=2"]), check_paths=False,
          check_device=False)  # 2 divides 4: accepted
    with pytest.raises(ConfigError) as caught:
        check(load_config(small + overrides), check_paths=False, check_device=False)
    assert any(message in p for p in caught.value.problems), caught.value.problems


# ---------------------------------------------------------------------------------------------- load, save, merge
def read_folder(folder: str) -> dict[str, torch.Tensor]:
    tensors = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(folder, name)))
    return tensors


def save_hf(kind: str, folder: str) -> dict[str, torch.Tensor]:
    """The random model as a Hugging Face folder in several safetensors files (transformers writes the experts one
    tensor per expert, the layout of the hub's MoE checkpoints); returns the model's own (stacked) tensors."""
    model = tiny_moe(kind)
    model.save_pretrained(folder, max_shard_size="20KB")
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def _ep_runner(folder: str, ep_size: int):
    fsdp_config = FSDPConfig(expert_parallel_size=ep_size,
                             mixed_precision=MixedPrecisionConfig(param_dtype="fp32", reduce_dtype="fp32"))
    model = load_causal_lm(folder, dtype="fp32", device="meta")
    return ModelRunner(model, fsdp_config, trainable=True, weights_folder=sharded_load_folder(folder))


def _full(model) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in iter_full_parameters(model, device="cpu")}


def load_save_job(folder: str, ckpt: str, ckpt_after_step: str, ep_size: int) -> dict:
    """Sharded load into EP=ep_size (+ FSDP2), save; one AdamW step, save again; a second model loaded from the
    folder resumes from the second checkpoint. EP=1: FSDP2 alone shards the experts (dim 0, 4 per rank)."""


    rank, world_size = rank_and_world()
    runner = _ep_runner(folder, ep_size)
    model = runner.model
    assert runner.mesh.ep_size == ep_size
    assert {m.config._experts_implementation for m in experts_modules(model)} == \
        ({IMPLEMENTATION} if ep_size > 1 else {model.config._experts_implementation})
    local_experts = {name: p.to_local().clone() for name, p in model.named_parameters()
                     if name.endswith(("experts.gate_up_proj", "experts.down_proj"))}
    buffers = {name: b.clone() for name, b in model.named_buffers() if name.endswith("e_score_correction_bias")}
    save_checkpoint(ckpt, model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    input_ids, mask = make_batch()
    rank_loss(model, input_ids, mask, rank, world_size).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    save_checkpoint(ckpt_after_step, model, optimizer, extra={"step": 1})
    stepped = _full(model)
    resumed_runner = _ep_runner(folder, ep_size)
    resumed_optimizer = torch.optim.AdamW(resumed_runner.model.parameters(), lr=1e-2)
    extra = load_checkpoint(ckpt_after_step, resumed_runner.model, resumed_optimizer)
    states = {}
    for optim, tag in ((optimizer, "saved"), (resumed_optimizer, "resumed")):
        by_name = dict(zip([n for n, _ in model.named_parameters()], optim.param_groups[0]["params"]))
        states[tag] = {n: optim.state[p]["exp_avg"].to_local().clone() for n, p in by_name.items()
                       if isinstance(p, DTensor) and p in optim.state}
    return {"local_experts": local_experts, "buffers": buffers, "stepped": stepped,
            "resumed": _full(resumed_runner.model), "extra": extra, "states": states}


def resume_one_process_job(folder: str, ckpt: str) -> dict:
    """The EP checkpoint loaded into a plain one-process model + optimizer (DCP reshards the experts)."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    extra = load_checkpoint(ckpt, model, optimizer)
    by_name = dict(zip([n for n, _ in model.named_parameters()], optimizer.param_groups[0]["params"]))
    return {"extra": extra, "params": {n: t.detach().clone() for n, t in model.state_dict().items()},
            "exp_avg": {n: optimizer.state[p]["exp_avg"].clone() for n, p in by_name.items() if p in optimizer.state}}


@pytest.mark.parametrize("kind, ep_size", [("qwen3_moe", 2), ("deepseek_v3", 2), ("qwen3_moe", 1)])
def test_sharded_load_checkpoint_and_merge_round_trip(dist_pool2, dist_pool1, tmp_path, kind, ep_size):
    """The checkpoint on disk stores one tensor per expert; the sharded loader stacks each rank's block (before
    this, FSDP2 alone also lost them: the stacked names are in no file, so they were drawn fresh with a warning)."""


    folder, ckpt, ckpt_step = str(tmp_path / "hf"), str(tmp_path / "ckpt"), str(tmp_path / "ckpt_step")
    stacked = save_hf(kind, folder)
    files = read_folder(folder)
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in files  # per-expert on disk, stacked in the model
    results = dist_pool2.run(load_save_job, folder, ckpt, ckpt_step, ep_size)
    # each rank read its own block of experts: rank r holds experts [4r, 4r + 4) of every MoE layer
    for rank, result in enumerate(results):
        assert result["local_experts"]
        for name, local in result["local_experts"].items():
            assert torch.equal(local, stacked[name][4 * rank: 4 * rank + 4]), name
        for name, value in result["buffers"].items():  # DeepSeek-V3's correction bias comes from the file
            assert torch.equal(value, stacked[name]) and value.abs().sum() > 0
    # merge writes the Hugging Face layout, bit for bit the files that were loaded
    merged = read_folder(merge_checkpoint(ckpt, str(tmp_path / "merged")))
    assert merged.keys() == files.keys()
    for name, value in files.items():
        assert merged[name].dtype == value.dtype and torch.equal(merged[name], value), name
    # after a step: the merged folder loads (transformers) to the trained weights, and a resumed model (+ its
    # optimizer) equals the saved one
    merged_step = AutoModelForCausalLM.from_pretrained(merge_checkpoint(ckpt_step, str(tmp_path / "merged_step")),
                                                       dtype=torch.float32).state_dict()
    for result in results:
        assert result["extra"] == {"step": 1}
        assert result["stepped"].keys() == result["resumed"].keys()
        for name, value in result["stepped"].items():
            assert torch.equal(result["resumed"][name], value), name
            assert torch.equal(merged_step[name], value), name
        assert all(not torch.equal(result["stepped"][n], stacked[n]) for n in result["local_experts"])
        assert result["states"]["saved"].keys() == result["states"]["resumed"].keys()
        assert any(n.endswith("experts.gate_up_proj") for n in result["states"]["saved"])
        for name, value in result["states"]["saved"].items():
            assert torch.equal(result["states"]["resumed"][name], value), name
    # the same checkpoint resumed by one process holding every expert: weights and Adam moments bit for bit
    one = dist_pool1.run(resume_one_process_job, folder, ckpt_step)[0]
    assert one["params"].keys() == results[0]["stepped"].keys()
    for name, value in results[0]["stepped"].items():
        assert torch.equal(one["params"][name], value), name
    name = next(n for n in results[0]["states"]["saved"] if n.endswith("experts.gate_up_proj"))
    for rank, result in enumerate(results):  # each rank's Adam moments are its block (experts 4r..4r+3) of the full
        assert torch.equal(one["exp_avg"][name][4 * rank: 4 * rank + 4], result["states"]["saved"][name]), name
