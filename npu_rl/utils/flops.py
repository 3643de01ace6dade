"""FLOPs of a decoder-only transformer step, for MFU.

Per token, a dense decoder does 2 FLOPs per matmul weight in the forward pass and twice that in the backward pass
(6 N per token for training, N = parameters outside the embeddings), plus attention scores and values:
2 x 2 x (sequence length) x (heads x head_dim) per layer per token in the forward pass, causal masking not
discounted (as in verl and Megatron's estimates). Counted from the model config, so it holds for a sharded model.
A vision-language model is counted by its language model (``text_config``): the vision tower's work is left out, so
its MFU reads low by that share (small for a few images per prompt).
"""

from __future__ import annotations


def _text(config):
    """A vision-language config's language-model part (``text_config``); the config itself otherwise."""
    text = getattr(config, "text_config", None)
    return text if text is not None and hasattr(text, "num_attention_heads") else config


def dense_params(config) -> int:
    """Matmul parameters per token: attention projections, MLP and the output head (embedding lookup excluded)."""
    config = _text(config)
    hidden = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    intermediate = config.intermediate_size
    attn = hidden * head_dim * (heads + 2 * kv_heads) + heads * head_dim * hidden
    mlp = 3 * hidden * intermediate  # gate, up, down (SwiGLU)
    return config.num_hidden_layers * (attn + mlp) + config.vocab_size * hidden


def step_flops(config, seqlens: list[int], backward: bool = True) -> float:
    """FLOPs to run forward (+ backward) over sequences of the given lengths."""
    config = _text(config)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    tokens = sum(seqlens)
    matmul = 2 * dense_params(config) * tokens
    attention = 4 * config.num_hidden_layers * heads * head_dim * sum(s * s for s in seqlens)
    return (matmul + attention) * (3 if backward else 1)
