"""Tiny random mixture-of-experts models (transformers' own classes) and their HF folders, for the MoE tests."""

from __future__ import annotations

import os

import torch
from transformers import (DeepseekV3Config, DeepseekV3ForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig,
                          Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

from npu_rl.models.synthetic import char_tokenizer

VOCAB = 128


def qwen3_moe_config(**overrides) -> Qwen3MoeConfig:
    fields = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=8,
                  num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=512, eos_token_id=2,
                  pad_token_id=0, bos_token_id=None, tie_word_embeddings=False)
    return Qwen3MoeConfig(**(fields | overrides))


def deepseek_v3_config(**overrides) -> DeepseekV3Config:
    fields = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                  num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                  num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, n_shared_experts=1,
                  kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                  routed_scaling_factor=2.5, max_position_embeddings=512, eos_token_id=2, pad_token_id=0,
                  bos_token_id=None, tie_word_embeddings=False)
    return DeepseekV3Config(**(fields | overrides))


def tiny_moe(kind: str = "qwen3_moe", seed: int = 0, **overrides) -> torch.nn.Module:
    """qwen3_moe | deepseek_v3 | qwen2_moe (a shared expert with its gate; top-k weights not renormalised) |
    mixtral (8 experts of intermediate 16)."""
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  num_experts_per_tok=2, max_position_embeddings=512, eos_token_id=2, pad_token_id=0, bos_token_id=None,
                  tie_word_embeddings=False)
    if kind == "qwen3_moe":
        model = Qwen3MoeForCausalLM(qwen3_moe_config(**overrides))
    elif kind == "qwen2_moe":
        model = Qwen2MoeForCausalLM(Qwen2MoeConfig(**(common | dict(
            intermediate_size=64, moe_intermediate_size=16, shared_expert_intermediate_size=32, num_experts=8) | overrides)))
    elif kind == "mixtral":
        model = MixtralForCausalLM(MixtralConfig(**(common | dict(intermediate_size=16, num_local_experts=8) | overrides)))
    else:
        model = DeepseekV3ForCausalLM(deepseek_v3_config(**overrides))
        with torch.no_grad():  # a non-zero correction bias, so that replay must reproduce a biased choice
            for module in model.modules():
                if hasattr(module, "e_score_correction_bias"):
                    module.e_score_correction_bias.normal_(0, 0.05)
    with torch.no_grad():  # transformers initialises the routers to zero: every token would tie
        for name, param in model.named_parameters():
            if name.endswith("gate.weight"):
                param.normal_(0, 0.5)
    return model.float()


def save_tiny_moe(path: str, kind: str = "qwen3_moe", seed: int = 0, **overrides) -> str:
    os.makedirs(path, exist_ok=True)
    tokenizer = char_tokenizer()
    model = tiny_moe(kind, seed, **overrides)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
