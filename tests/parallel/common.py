"""Shared pieces of the distributed tests: tiny models, data, and the per-rank loss.

All parity tests run in float32. Two computations that are mathematically equal but sum in a different order
(2 ranks vs 1, packed vs padded) differ by a few ulps; the tolerances used are stated where they are asserted.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

NUM_SHARDS = 2  # the global batch is always cut into 2 shards, so 1-rank and 2-rank runs see the same loss


def tiny_model(seed: int = 0, tie: bool = True, kv_heads: int = 2, layers: int = 2):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=256,
                         tie_word_embeddings=tie, eos_token_id=2, pad_token_id=0, bos_token_id=None)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).float()


def make_batch(seed: int = 1, rows: int = 4, seq_len: int = 12):
    """``input_ids`` and an ``attention_mask`` with left padding, right padding and a full row."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, 128, (rows, seq_len), generator=gen)
    mask = torch.ones(rows, seq_len, dtype=torch.long)
    lengths = torch.randint(seq_len // 2, seq_len + 1, (rows,), generator=gen)
    for r in range(rows):
        if r % 2:
            mask[r, lengths[r]:] = 0  # right padding
        else:
            mask[r, : seq_len - lengths[r]] = 0  # left padding
    return input_ids, mask


def mean_nll(model, input_ids, mask) -> torch.Tensor:
    """Token-mean next-token NLL over valid positions (padded forward)."""
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False).logits
    targets = torch.roll(input_ids, -1, dims=1)
    valid = (mask * torch.roll(mask, -1, dims=1)).bool()
    valid[:, -1] = False
    nll = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")
    return (nll * valid).sum() / valid.sum()


def rank_loss(model, input_ids, mask, rank: int, world_size: int) -> torch.Tensor:
    """This rank's loss such that FSDP's gradient average equals the gradient of the mean shard loss."""
    shards = list(zip(input_ids.chunk(NUM_SHARDS), mask.chunk(NUM_SHARDS)))
    mine = [mean_nll(model, ids, m) for k, (ids, m) in enumerate(shards) if k % world_size == rank]
    return torch.stack(mine).sum() * world_size / NUM_SHARDS


def full_grads(model) -> dict[str, torch.Tensor]:
    from npu_rl.parallel.weights import full_tensor

    return {n: full_tensor(p.grad).detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def rank_and_world() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def tiny_value_model(seed: int = 0):
    """The critic's shape: a token-classification head with one label (verl's value model)."""
    from transformers import Qwen2Config, Qwen2ForTokenClassification

    config = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=0,
                         classifier_dropout=0.0)  # RL critics run without dropout
    torch.manual_seed(seed)
    return Qwen2ForTokenClassification(config).float()
