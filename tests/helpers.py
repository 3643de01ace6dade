"""Tiny models and tokenizers built in the test session (no downloads); thin wrappers over npu_rl.models.synthetic."""

from __future__ import annotations

import torch

from npu_rl.models.synthetic import CHATML_TEMPLATE, SPECIAL_TOKENS, char_tokenizer, random_causal_lm, save_random_model

__all__ = ["CHATML_TEMPLATE", "SPECIAL_TOKENS", "make_tiny_tokenizer", "make_tiny_model", "save_tiny_model_dir"]


def make_tiny_tokenizer(chat_template: bool = True, pad_is_eos: bool = False):
    """Character-level: 0 <|endoftext|>, 1 <|im_start|>, 2 <|im_end|>, then printable ASCII."""
    return char_tokenizer(chat_template=chat_template, pad_is_eos=pad_is_eos)


def make_tiny_model(vocab_size: int = 128, seed: int = 0, hidden_size: int = 64, num_layers: int = 2,
                    tie_word_embeddings: bool = True, dtype=torch.float32):
    """A 2-layer Qwen2 with random weights (~0.1 M parameters)."""
    return random_causal_lm("tiny", seed, dtype, vocab_size=vocab_size, hidden_size=hidden_size,
                            intermediate_size=2 * hidden_size, num_hidden_layers=num_layers,
                            tie_word_embeddings=tie_word_embeddings, max_position_embeddings=1024)


def save_tiny_model_dir(path: str, pad_is_eos: bool = False, seed: int = 0, hidden_size: int = 64, **kwargs) -> str:
    """A tiny model + tokenizer folder that ``from_pretrained`` (and ``model.path``) can load."""
    return save_random_model(path, "tiny", seed, pad_is_eos, hidden_size=hidden_size,
                             intermediate_size=2 * hidden_size, **kwargs)


def write_verl_parquet(path) -> str:
    """A data file that validation reads: one row of verl's schema that the gsm8k rule scorer takes (a placeholder
    where a test needs the path to exist; an empty file is not parquet, and is refused)."""
    from npu_rl.data.io import write_parquet

    return write_parquet([{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "1 + 1 = ?"}],
                           "ability": "math", "reward_model": {"style": "rule", "ground_truth": "2"},
                           "extra_info": {"split": "train", "index": 0}}], str(path))
