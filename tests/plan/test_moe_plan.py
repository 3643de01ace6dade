"""The planner counts mixture-of-experts models as such: total and active parameters against hand-computed counts
(Qwen3-30B-A3B: 30.5B / 3.3B; DeepSeek-V3: 671B / 37B), expert shards under an EP size, the all-to-all buffers and
the routed activations."""

from __future__ import annotations

import json

import pytest

from npu_rl.plan.job import check_ep, model_summary
from npu_rl.plan.model_shape import shape_from_config
from npu_rl.plan.memory import GIB, RoleMemory, TrainSettings

# The published config.json fields that count (Qwen/Qwen3-30B-A3B, deepseek-ai/DeepSeek-V3).
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
                 "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
                 "tie_word_embeddings": False, "attention_bias": False, "num_experts": 128,
                 "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
                 "mlp_only_layers": [], "norm_topk_prob": True}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
               "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280,
               "tie_word_embeddings": False, "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1,
               "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "moe_layer_freq": 1, "q_lora_rank": 1536,
               "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
               "n_group": 8, "topk_group": 4}


def test_qwen3_30b_a3b_counts():
    shape = shape_from_config(QWEN3_30B_A3B)
    # attention: q 2048x4096 (8,388,608) + k, v 2 x 2048x512 (2,097,152) + o 4096x2048 (8,388,608)
    # + q/k norms 2x128 = 18,874,624
    assert shape.attention_params == 18_874_624
    # one expert: 3 x 2048 x 768 = 4,718,592; a layer: attention + 2 norms (4,096) + router 128x2048 (262,144)
    # + 128 experts (603,979,776) = 623,120,640
    assert shape.moe_layer_params() == 623_120_640
    # 48 layers (29,909,790,720) + embeddings and LM head 2 x 151,936 x 2048 + final norm 2048 (622,331,904)
    assert shape.num_params == 30_532_122_624  # 30.5B
    # active: 48 x (18,874,624 + 4,096 + 262,144 + 8 x 4,718,592) + 622,331,904
    assert shape.num_active_params == 3_353_032_704  # 3.3B
    assert shape.num_expert_params == 48 * 128 * 4_718_592
    assert shape.num_dense_layers == 0 and shape.num_moe_layers == 48


def test_deepseek_v3_counts():
    shape = shape_from_config(DEEPSEEK_V3)
    # MLA: q_a 7168x1536 + norm 1536 + q_b 1536x(128x192) + kv_a 7168x576 + norm 512 + kv_b 512x(128x256)
    # + o (128x128)x7168 = 187,107,328
    assert shape.attention_params == 187_107_328
    # dense layer (3 of them): 187,107,328 + norms 14,336 + MLP 3 x 7168 x 18432 = 583,483,392
    assert shape.dense_layer_params == 583_483_392
    # MoE layer (58): 187,107,328 + 14,336 + router 256x7168 (1,835,008) + shared 3x7168x2048 (44,040,192)
    # + 256 experts x 44,040,192 = 11,507,286,016
    assert shape.moe_layer_params() == 11_507_286_016
    # + embeddings and LM head 2 x 129,280 x 7168 + norm 7168: 671,026,404,352 (the MTP layer is not counted)
    assert shape.num_params == 671_026_404_352
    # active: 58 x (187,121,664 + 1,835,008 + 44,040,192 + 8 x 44,040,192) + 3 x 583,483,392 + 1,853,365,248
    assert shape.num_active_params == 37_552_282_624
    assert (shape.num_dense_layers, shape.num_moe_layers) == (3, 58)


@pytest.mark.parametrize("fields", [QWEN3_30B_A3B, DEEPSEEK_V3], ids=["qwen3_30b_a3b", "deepseek_v3"])
def test_total_equals_transformers_own_model_on_the_meta_device(fields):
    import torch
    from transformers import AutoModelForCausalLM, DeepseekV3Config, Qwen3MoeConfig

    config_class = Qwen3MoeConfig if fields["model_type"] == "qwen3_moe" else DeepseekV3Config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config_class(**{k: v for k, v in fields.items()
                                                                 if k != "model_type"}))
    assert sum(p.numel() for p in model.parameters()) == shape_from_config(fields).num_params


def test_expert_shards_gathered_layer_and_all_to_all_under_ep():
    shape = shape_from_config(QWEN3_30B_A3B)
    # FSDP2 gathers an MoE layer with its local experts only: 128 / 8 = 16 of them
    assert shape.gathered_layer_params(8) == 18_874_624 + 4_096 + 262_144 + 16 * 4_718_592
    # dispatch: send + receive of 8 copies x 2048 x bf16 per token
    assert shape.all_to_all_bytes_per_token(8) == 2 * 8 * 2048 * 2 and shape.all_to_all_bytes_per_token(1) == 0
    # routed activations per token of an MoE layer: the router's fp32 softmax 4 x 128 and top-k sum 4, per copy
    # 4 x 2048 (permuted input, down output) + 8 x 768 (gate_up output, activation, product) + 38 (its fp32 and
    # bf16 weight, 4 int64 indices); 115,508 measured on the real layer (docs/moe.md)
    assert shape.moe_activation_bytes_per_token() == 4 * 128 + 4 + 8 * (4 * 2048 + 8 * 768 + 38) == 115_508
    settings = TrainSettings(shard=16, ep=8, micro_tokens=4096)
    # FSDP2 holds the root (embeddings, LM head, norm) and two layers gathered in bf16
    root = 2 * 151_936 * 2048 + 2048
    assert RoleMemory(shape, settings, True).gathered() == (root + 2 * shape.gathered_layer_params(8)) * 2
    assert RoleMemory(shape, TrainSettings(shard=16), True).gathered() == (root + 2 * 623_120_640) * 2
    lines = model_summary(shape, settings)
    assert lines[0].startswith("model: qwen3_moe, 30.53B parameters, 3.35B active per token (8 of 128 routed experts")
    # 28.99B expert parameters in fp32 over 16 ranks: 7.3 GiB each
    assert "16 experts per layer on each rank" in lines[1]
    assert f"{48 * 128 * 4_718_592 * 4 / 16 / GIB:.1f} GiB of expert weights per rank (fp32, on the device)" in lines[1]
    assert f"all-to-all buffers: {4096 * 2 * 8 * 2048 * 2 / GIB:.2f} GiB per MoE layer" in lines[2]


def test_ep_must_divide_experts_and_ranks():
    shape = shape_from_config(QWEN3_30B_A3B)
    check_ep(shape, 8, 16)
    with pytest.raises(ValueError, match="does not divide the model's 128 routed experts"):
        check_ep(shape, 6, 12)
    with pytest.raises(ValueError, match="does not divide the 12 ranks"):
        check_ep(shape, 8, 12)
    with pytest.raises(ValueError, match="has no routed experts"):
        check_ep(shape_from_config({**QWEN3_30B_A3B, "num_experts": 0, "model_type": "qwen3"}), 2, 8)


def test_plan_command_prints_the_moe_lines(tmp_path, capsys):
    from npu_rl.commands.plan import main

    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(QWEN3_30B_A3B))
    code = main(["--device", "atlas-a3", "--model-config", str(config_file), "--ep", "8",
                 "actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B", "trainer.n_gpus_per_node=16",
                 "actor_rollout_ref.rollout.tensor_model_parallel_size=4", "data.train_batch_size=64",
                 "actor_rollout_ref.actor.ppo_mini_batch_size=16", "algorithm.adv_estimator=grpo"])
    out = capsys.readouterr().out
    assert code in (0, 1) and "model: qwen3_moe, 30.53B parameters" in out and "ep=8" in out
    assert main(["--device", "atlas-a3", "--model-config", str(config_file), "--ep", "5",
                 "actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B", "trainer.n_gpus_per_node=16"]) == 2
    assert "--ep 5 does not divide the model's 128 routed experts" in capsys.readouterr().err


def test_docs_show_the_moe_plans():
    """docs/distributed.md prints the plans of DeepSeek-V3 671B on 8 A3 nodes and Qwen3-30B-A3B on one: still true."""
    import os

    from npu_rl.compat.verl.translate import translate_overrides
    from npu_rl.config.loader import load_config
    from npu_rl.plan.job import plan_config

    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    data = os.path.join(root, "tests", "data", "plan")

    def overrides(name: str) -> list[str]:
        with open(os.path.join(data, name)) as f:
            return [line for line in f.read().splitlines() if line and not line.startswith("#")]

    deepseek = plan_config(load_config(translate_overrides(overrides("deepseek_v3_671b_grpo.txt") + [
        "trainer.nnodes=8", "actor_rollout_ref.rollout.tensor_model_parallel_size=32",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.9"]), "ppo_trainer"), "atlas-a3",
        model_config=os.path.join(data, "deepseek-v3", "config.json"), ep=32)
    qwen = plan_config(load_config(translate_overrides(overrides("qwen3_30b_a3b_grpo.txt")), "ppo_trainer"),
                       "atlas-a3", model_config=os.path.join(data, "qwen3-30b-a3b", "config.json"), ep=8)
    with open(os.path.join(root, "docs", "distributed.md")) as f:
        docs = f.read()
    for result in (deepseek, qwen):
        assert result.fits and result.host_fits
        assert result.table() in docs and result.verdict() in docs


def _saved_bytes(module, inputs) -> int:
    """Bytes ``module``'s forward saves for backward, deduplicated by storage, its parameters and input left out."""
    import torch

    skip = {p.untyped_storage().data_ptr() for p in module.parameters()} | {inputs.untyped_storage().data_ptr()}
    seen: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(inputs)
    return sum(seen.values())


def test_routed_activation_bytes_are_what_transformers_moe_block_saves():
    """The planner's per-token bytes of an MoE block equal what transformers' Qwen3-MoE block (grouped_mm experts,
    bf16) saves for backward per extra token (the slope between two lengths: its few [experts]-sized tensors cancel)."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                            num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True)
    torch.manual_seed(0)
    block = Qwen3MoeForCausalLM(config).to(torch.bfloat16).model.layers[0].mlp
    per_length = {t: _saved_bytes(block, torch.randn(1, t, 32, dtype=torch.bfloat16, requires_grad=True))
                  for t in (64, 128)}
    slope = (per_length[128] - per_length[64]) / 64
    shape = shape_from_config({"model_type": "qwen3_moe", "hidden_size": 32, "intermediate_size": 64,
                               "moe_intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "head_dim": 8, "num_experts": 8, "num_experts_per_tok": 2,
                               "vocab_size": 64})
    assert slope == shape.moe_activation_bytes_per_token() == 4 * 8 + 4 + 2 * (4 * 32 + 8 * 16 + 38)


def test_qk_norm_keeps_fp32_inputs_and_bf16_outputs():
    shape = shape_from_config(QWEN3_30B_A3B)
    without = shape_from_config({**QWEN3_30B_A3B, "model_type": "qwen2_moe"})  # the same sizes, no q/k norms
    # q 32 x 128 = 4,096 and kv 4 x 128 = 512: each norm keeps 4 (fp32 input) + 2 (bf16 output) bytes an element
    assert shape._attention_activation_bytes() - without._attention_activation_bytes() == 6 * (4096 + 512)


def _moe_step_plan(engine: str, grad_cast_copy: bool = True):
    """The calibration's MoE rows (docs/benchmarks.md: 4 Qwen3-30B-A3B layers, 32 x 8 rows of 128 + 256 tokens),
    planned for the code they were measured with (``grad_cast_copy``: before 2026-12-03) or today's."""
    import tempfile
    from dataclasses import replace

    from npu_rl.config.loader import load_config
    from npu_rl.plan.calibration import ROWS, _model_config
    from npu_rl.plan.job import inputs_from_config, plan
    from npu_rl.plan.memory import device_spec

    row = next(r for r in ROWS if r.label.startswith("MoE") and (("vLLM" in r.label) == (engine == "vllm")))
    with tempfile.TemporaryDirectory() as folder:
        config_json = _model_config(folder, row.model)
        config = load_config(row.overrides + [f"actor_rollout_ref.model.path={folder}"], "ppo_trainer")
        inputs = inputs_from_config(config, model_config=config_json)
    inputs = replace(inputs, actor=replace(inputs.actor, grad_cast_copy=grad_cast_copy))
    return plan(inputs, device_spec("h200")), row, inputs


def test_grads_to_master_moment_of_the_moe_step():
    """One H200, fp32 master + bf16 compute copy, 8 micro-batches: grads_to_master's fp32 cast of every bf16
    gradient (4 bytes a parameter) is the update's peak, over the weights, AdamW and both gradient copies."""
    plan, row, inputs = _moe_step_plan("hf")
    params = plan.phases[0].parts["actor"] / (4 + 2 + 2 * 4)  # resident: fp32 + bf16 weights, two fp32 states
    update = plan.phases[-1]
    assert update.name == "actor update (grads to master)"
    assert update.parts["master-dtype gradient casts"] == pytest.approx(params * 4)
    assert update.parts["grads"] == pytest.approx(params * (4 + 2))
    assert update.bytes == pytest.approx(params * (6 + 8 + 6 + 4) + update.parts["reference"])
    assert plan.counted_asleep_bytes == 0 and plan.allocated_counter_gib == plan.peak.gib
    assert abs(plan.peak.gib / row.peak_gib - 1) <= 0.15
    # the optimizer step holds the fp32 gradients only (grads_to_master cleared the bf16 ones): step 1 of the same
    # run peaked at 46.5 GiB while AdamW created its states (docs/benchmarks.md)
    step = RoleMemory(inputs.actor_shape, inputs.actor, trainable=True).update_moments()["optimizer step"]
    assert step == {"weights": pytest.approx(params * 6), "grads": pytest.approx(params * 4),
                    "optimizer": pytest.approx(params * 8)}
    assert abs((sum(step.values()) + update.parts["reference"]) / GIB / 46.5 - 1) < 0.01
    # today's grads_to_master adds the bf16 gradients as they are (tests/workers/test_master_copy.py): the cast
    # moment is gone, and the peak moves to another moment, up to 4 bytes a parameter lower
    today, _, _ = _moe_step_plan("hf", grad_cast_copy=False)
    assert today.phases[-1].name != "actor update (grads to master)"
    assert plan.peak.bytes - params * 4 <= today.peak.bytes < plan.peak.bytes - params


def test_one_dtype_sharded_or_one_micro_batch_has_no_gradient_cast():
    shape = shape_from_config(QWEN3_30B_A3B)
    cast = RoleMemory(shape, TrainSettings(micro_batches_per_step=2, grad_cast_copy=True), True).master_grad_cast()
    assert cast == shape.num_params * 4
    assert RoleMemory(shape, TrainSettings(micro_batches_per_step=2), True).master_grad_cast() == 0  # today's code
    for settings in (dict(micro_batches_per_step=1), dict(shard=8, micro_batches_per_step=2),
                     dict(model_dtype="bf16", micro_batches_per_step=2)):
        assert RoleMemory(shape, TrainSettings(**settings, grad_cast_copy=True), True).master_grad_cast() == 0
    assert RoleMemory(shape, TrainSettings(micro_batches_per_step=2, grad_cast_copy=True),
                      False).master_grad_cast() == 0


def test_a_sleeping_vllm_still_counts_in_the_allocated_counter():
    """vLLM's CuMemAllocator unmaps a sleeping engine's weights and KV cache but keeps their tensors: the update's
    device bytes stay the hf row's, and the allocated counter adds the engine's weights and KV cache."""
    plan, row, _ = _moe_step_plan("vllm")
    rollout = plan.phases[0].parts
    assert plan.counted_asleep_bytes == rollout["engine weights"] + rollout["KV cache"]
    update = plan.phases[-1]
    assert plan.allocated_counter_gib == pytest.approx((update.bytes + plan.counted_asleep_bytes) / GIB)
    assert plan.peak.name == "rollout"  # device bytes: the awake engine's share
    assert abs(plan.allocated_counter_gib / row.peak_gib - 1) <= 0.15
