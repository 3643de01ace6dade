"""Tiny models and tokenizers built in the test session (no downloads)."""

from __future__ import annotations

import os
import string

import torch

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def make_tiny_tokenizer(chat_template: bool = True, pad_is_eos: bool = False):
    """A character-level tokenizer: printable ASCII + ChatML specials. ids: 0 <|endoftext|>, 1 <|im_start|>,
    2 <|im_end|>, then the characters. ``pad_is_eos`` mimics SmolLM2 (pad == end of turn)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|im_end|>" if pad_is_eos else "<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS,
    )
    if chat_template:
        fast.chat_template = CHATML_TEMPLATE
    fast.padding_side = "left"
    return fast


def make_tiny_model(vocab_size: int = 128, seed: int = 0, hidden_size: int = 64, num_layers: int = 2,
                    tie_word_embeddings: bool = True, dtype=torch.float32):
    """A 2-layer Qwen2 with random weights (~0.1 M parameters)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=tie_word_embeddings,
        eos_token_id=2,
        pad_token_id=0,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).to(dtype)


def save_tiny_model_dir(path: str, pad_is_eos: bool = False, seed: int = 0, **model_kwargs) -> str:
    """Write a tiny model + tokenizer folder that ``from_pretrained`` (and ``model.path``) can load."""
    os.makedirs(path, exist_ok=True)
    tokenizer = make_tiny_tokenizer(pad_is_eos=pad_is_eos)
    model = make_tiny_model(seed=seed, **model_kwargs)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
