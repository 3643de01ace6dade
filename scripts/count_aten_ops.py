"""Count the aten ops one micro-batch dispatches, per decoder layer: a no-grad log-prob forward against an update
(forward + backward), with and without gradient checkpointing. The planner's host floor
(``npu_rl/plan/timing.py``, ``HOST_LAYER_S``) takes the update's host cost per layer as the forward's times the ratio
counted here.

A Qwen2 config with the Qwen2.5-0.5B layer layout (14 query heads, 2 KV heads, tied embeddings) at a small width (op
counts do not depend on the width), the padded path of ``npu_rl.models.forward.response_logprobs`` with plain
log-probs (``use_fused_kernels=False``, as ``npu-rl bench verl`` runs), left-padded prompts (SDPA gets a mask), the
loss a sum of log-probs times advantages. The per-layer count is the difference between two depths divided by the
difference of depths; what is left is the micro-batch's fixed part (embedding, mask, log-probs, loss).

    python scripts/count_aten_ops.py            # 8 rows of 160 + 256 tokens, depths 12 and 24
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from npu_rl.models.forward import LogprobOptions, response_logprobs
from npu_rl.models.synthetic import random_causal_lm


class OpCounter(TorchDispatchMode):
    """Every aten op dispatched inside the block (the autograd engine's backward ops included)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _batch(rows: int, prompt: int, response: int, vocab: int, padding: int):
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, vocab, (rows, prompt + response), generator=g)
    attention_mask = torch.ones_like(input_ids)
    for row in range(rows):  # left padding: row r's prompt is shorter by up to ``padding`` tokens
        attention_mask[row, : (row * padding) // max(rows - 1, 1)] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids, input_ids[:, prompt:]


def count(layers: int, *, update: bool, checkpointing: bool, rows: int, prompt: int, response: int,
          padding: int) -> int:
    """Aten ops of one micro-batch on a model of ``layers`` decoder layers."""
    model = random_causal_lm("qwen2.5-0.5b", hidden_size=112, intermediate_size=224, num_hidden_layers=layers,
                             vocab_size=1024)
    model.train(update)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    input_ids, attention_mask, position_ids, responses = _batch(rows, prompt, response, 1024, padding)
    options = LogprobOptions(use_fused_kernels=False)
    advantages = torch.randn(rows, 1)
    with OpCounter() as counter:
        if update:
            logprobs, _ = response_logprobs(model, input_ids, attention_mask, position_ids, responses, 1.0, options)
            (logprobs * advantages).sum().backward()
        else:
            with torch.no_grad():
                response_logprobs(model, input_ids, attention_mask, position_ids, responses, 1.0, options)
    return sum(counter.ops.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=160)
    parser.add_argument("--response-length", type=int, default=256)
    parser.add_argument("--left-padding", type=int, default=32, help="the most padding a row's prompt gets (0: none)")
    parser.add_argument("--depths", default="12,24")
    args = parser.parse_args()
    low, high = (int(d) for d in args.depths.split(","))
    sizes = dict(rows=args.rows, prompt=args.prompt_length, response=args.response_length, padding=args.left_padding)
    per_layer = {}
    print(f"{'pass':34s} {'ops at ' + str(low):>10s} {'ops at ' + str(high):>10s} {'per layer':>10s} {'fixed':>8s}")
    for name, update, checkpointing in (("no-grad forward", False, False), ("update, no checkpointing", True, False),
                                        ("update, gradient checkpointing", True, True)):
        a, b = (count(d, update=update, checkpointing=checkpointing, **sizes) for d in (low, high))
        per_layer[name] = (b - a) / (high - low)
        print(f"{name:34s} {a:10d} {b:10d} {per_layer[name]:10.1f} {a - per_layer[name] * low:8.0f}")
    forward = per_layer["no-grad forward"]
    for name in ("update, no checkpointing", "update, gradient checkpointing"):
        print(f"{name}: {per_layer[name] / forward:.2f} x the forward's ops per layer")


if __name__ == "__main__":
    main()
