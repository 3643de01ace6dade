"""Models with random weights built from hand-written configs, and a character-level tokenizer.

For tests (tiny shapes) and for performance work where no weights can be downloaded (the H200 has none): the shapes
of real architectures (Qwen2.5-0.5B / 1.5B / 7B, from their published configs) with random weights do exactly the
work the real ones do. The tokenizer covers printable ASCII plus ChatML's special tokens; ids beyond its vocabulary
(a random model samples from all 151,936) decode to nothing.
"""

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

# Published configs of the Qwen2.5 family (hidden, intermediate, layers, heads, kv heads, vocab, tied).
SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=128, tie_word_embeddings=True),
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}


def char_tokenizer(chat_template: bool = True, pad_is_eos: bool = False):
    """ids: 0 <|endoftext|>, 1 <|im_start|>, 2 <|im_end|> (end of turn), then the printable characters.
    ``pad_is_eos`` mimics SmolLM2 (pad == end of turn)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
        pad_token="<|im_end|>" if pad_is_eos else "<|endoftext|>", additional_special_tokens=SPECIAL_TOKENS)
    if chat_template:
        fast.chat_template = CHATML_TEMPLATE
    fast.padding_side = "left"
    return fast


def random_causal_lm(shape: str = "tiny", seed: int = 0, dtype=torch.float32, **overrides):
    """A Qwen2 causal LM of ``shape`` (a SHAPES key) with random weights; ``overrides`` change config fields."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; known: {', '.join(SHAPES)}")
    fields = {"max_position_embeddings": 32768, "eos_token_id": 2, "pad_token_id": 0, "bos_token_id": None,
              **SHAPES[shape], **overrides}
    config = Qwen2Config(**fields)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).to(dtype)


def save_random_model(path: str, shape: str = "tiny", seed: int = 0, pad_is_eos: bool = False,
                      dtype=torch.float32, **overrides) -> str:
    """An HF folder (random weights + the char tokenizer) that ``model.path`` can point at."""
    os.makedirs(path, exist_ok=True)
    tokenizer = char_tokenizer(pad_is_eos=pad_is_eos)
    model = random_causal_lm(shape, seed, dtype, **overrides)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
