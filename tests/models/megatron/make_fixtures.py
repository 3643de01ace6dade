"""Writes the Megatron checkpoints tests/models/megatron/ converts: tiny GPT models built by the real megatron-core
(0.16.1, on CPU, 2 gloo processes, tensor parallel 2), saved in the two formats Megatron-LM / MindSpeed users hold:

- ``torch_dist``: ``megatron.core.dist_checkpointing.save`` of the model's sharded state dict (``.metadata``,
  ``__*.distcp``, ``common.pt``), plus the ``args`` Megatron-LM keeps in ``common.pt``;
- legacy: ``iter_0000001/mp_rank_0{t}/model_optim_rng.pt`` per tensor-parallel rank (``{"model": state_dict,
  "args": Namespace, "checkpoint_version": 3.0, "iteration": 1}``, as Megatron-LM's ``save_checkpoint`` writes it),
  and ``latest_checkpointed_iteration.txt``.

Beside each, ``reference.pt``: input ids and the model's full-vocabulary logits from megatron-core's own forward. Run
(not part of the tests; its output is committed):

    pip install --target /tmp/mcore megatron-core==0.16.1 --no-deps
    PYTHONPATH=/tmp/mcore:. torchrun --nproc-per-node 2 tests/models/megatron/make_fixtures.py OUT_DIR [FAMILY ...]

The families: qwen2, qwen3, llama (dense) and qwen3_moe (Qwen3-MoE: every layer's MLP a mixture of experts, top-k
softmax over the chosen experts' logits as Qwen3-MoE's ``norm_topk_prob``; megatron-core's local spec builds its
experts as a ``SequentialMLP`` on CPU, each expert's weights split over the tensor-parallel ranks; the token
dispatcher ``allgather``). No DeepSeek-V3: megatron-core 0.16.1 does not build its multi-latent attention without
Transformer Engine (the local spec's ``DotProductAttention`` refuses MLA's ``k_channels``: tried, 2026-12-03).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

VOCAB, HIDDEN, HEADS, GROUPS, FFN, LAYERS, HEAD_DIM = 128, 32, 4, 2, 64, 2, 8
EXPERTS, TOPK, MOE_FFN = 4, 2, 16  # qwen3_moe

FAMILIES = {  # Megatron-LM arguments of each family (as its Qwen2 / Qwen3 / Llama scripts pass them)
    "qwen2": dict(add_qkv_bias=True, qk_layernorm=False, rotary_base=1000000.0, norm_epsilon=1e-6),
    "qwen3": dict(add_qkv_bias=False, qk_layernorm=True, rotary_base=1000000.0, norm_epsilon=1e-6),
    "llama": dict(add_qkv_bias=False, qk_layernorm=False, rotary_base=500000.0, norm_epsilon=1e-5),
    "qwen3_moe": dict(add_qkv_bias=False, qk_layernorm=True, rotary_base=1000000.0, norm_epsilon=1e-6, moe=True),
}
MOE = dict(num_moe_experts=EXPERTS, moe_router_topk=TOPK, moe_ffn_hidden_size=MOE_FFN, moe_grouped_gemm=False,
           moe_router_pre_softmax=False, moe_router_score_function="softmax", moe_router_load_balancing_type="none",
           moe_token_dispatcher_type="allgather", moe_aux_loss_coeff=0.0)


def build(family: str, tp: int):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    f = FAMILIES[family]
    moe = MOE if f.get("moe") else {}
    config = TransformerConfig(**moe,
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, num_query_groups=GROUPS,
        ffn_hidden_size=FFN, kv_channels=HEAD_DIM, gated_linear_unit=True, activation_func=F.silu,
        normalization="RMSNorm", layernorm_epsilon=f["norm_epsilon"], add_bias_linear=False,
        add_qkv_bias=f["add_qkv_bias"], qk_layernorm=f["qk_layernorm"], tensor_model_parallel_size=tp,
        use_cpu_initialization=True, params_dtype=torch.float32, bias_activation_fusion=False,
        bias_dropout_fusion=False, apply_rope_fusion=False, masked_softmax_fusion=False,
        gradient_accumulation_fusion=False, persist_layer_norm=False, hidden_dropout=0.0, attention_dropout=0.0,
        init_method_std=0.2)
    torch.manual_seed(1234)
    spec = get_gpt_layer_local_spec(num_experts=moe.get("num_moe_experts"), moe_grouped_gemm=False,
                                    qk_layernorm=f["qk_layernorm"], normalization="RMSNorm")
    model = GPTModel(config, spec,
                     vocab_size=VOCAB, max_sequence_length=64, position_embedding_type="rope",
                     rotary_base=f["rotary_base"], share_embeddings_and_output_weights=False, parallel_output=False)
    with torch.no_grad():  # norms away from 1 and biases away from 0, so that a misplaced one shows
        for name, p in model.named_parameters():
            if "layernorm" in name or name.endswith("norm.weight") or "bias" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model.eval(), config


def args_of(family: str, tp: int):
    f = FAMILIES[family]
    moe = dict(num_experts=EXPERTS, moe_router_topk=TOPK, moe_ffn_hidden_size=MOE_FFN, moe_layer_freq=1,
               moe_router_pre_softmax=False, moe_router_score_function="softmax", moe_grouped_gemm=False,
               moe_shared_expert_intermediate_size=None, expert_model_parallel_size=1,
               expert_tensor_parallel_size=tp) if f.get("moe") else {}
    return argparse.Namespace(**moe,
        num_layers=LAYERS, hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS,
        group_query_attention=True, num_query_groups=GROUPS, kv_channels=HEAD_DIM, padded_vocab_size=VOCAB,
        max_position_embeddings=64, seq_length=64, swiglu=True, normalization="RMSNorm", norm_epsilon=f["norm_epsilon"],
        add_bias_linear=False, add_qkv_bias=f["add_qkv_bias"], qk_layernorm=f["qk_layernorm"],
        untie_embeddings_and_output_weights=True, position_embedding_type="rope", rotary_base=f["rotary_base"],
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=1, params_dtype=torch.float32,
        ckpt_format="torch_dist", iteration=1)


def main() -> int:
    out = sys.argv[1]
    torch.cuda.current_device = lambda: "cpu"  # megatron-core's rotary moves its frequencies to "the" GPU
    torch.cuda.synchronize = lambda *a, **k: None  # and its checkpoint writer waits for it
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    from megatron.core import dist_checkpointing, parallel_state, tensor_parallel

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
    # the attention forks the CUDA RNG tracker around its dropout (0 here): nothing to fork on CPU
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    from megatron.core.transformer.moe import moe_utils

    # megatron-core 0.16.1 leaves this name undefined without Transformer Engine; the router's own matmul is used
    # when it is None
    moe_utils.__dict__.setdefault("te_general_gemm", None)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(12).unsqueeze(0).expand(2, -1)
    causal = torch.triu(torch.ones(1, 1, 12, 12, dtype=torch.bool), diagonal=1)  # True: masked
    for family in sys.argv[2:] or FAMILIES:
        model, _ = build(family, world)
        with torch.no_grad():
            logits = model(ids, positions, causal)  # [b, s, V], gathered over the TP ranks
        folder = os.path.join(out, f"{family}_tp{world}")
        legacy = os.path.join(folder, "legacy")
        shard = os.path.join(legacy, "iter_0000001", f"mp_rank_{rank:02d}")
        os.makedirs(shard, exist_ok=True)
        torch.save({"model": model.state_dict_for_save_checkpoint(), "args": args_of(family, world),
                    "checkpoint_version": 3.0, "iteration": 1}, os.path.join(shard, "model_optim_rng.pt"))
        dist_dir = os.path.join(folder, "torch_dist", "iter_0000001")
        if rank == 0:
            os.makedirs(dist_dir, exist_ok=True)
            with open(os.path.join(legacy, "latest_checkpointed_iteration.txt"), "w") as f:
                f.write("1")
            with open(os.path.join(folder, "torch_dist", "latest_checkpointed_iteration.txt"), "w") as f:
                f.write("1")
            torch.save({"ids": ids, "logits": logits}, os.path.join(folder, "reference.pt"))
        dist.barrier()
        state = model.sharded_state_dict()
        state["args"] = args_of(family, world)  # common (non-sharded) entries land in common.pt
        state["iteration"] = 1
        dist_checkpointing.save(state, dist_dir)
        dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
