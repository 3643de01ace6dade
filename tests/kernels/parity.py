"""Helpers shared by the kernel tests: error measures and random problems."""

from __future__ import annotations

import torch


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected||, in float64 on the CPU."""
    expected = expected.detach().double().cpu()
    diff = actual.detach().double().cpu() - expected
    return (diff.norm() / expected.norm().clamp_min(1e-300)).item()


def make_problem(num_tokens, hidden_size, vocab, dtype, device, seed=0, scale=1.0):
    """Hidden states, an lm_head weight whose logits have a spread like a trained model's (std ~ 2 * scale), and
    targets that include the first and the last vocabulary ids (the last one sits in a partial tile)."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(num_tokens, hidden_size, generator=gen)
    weight = torch.randn(vocab, hidden_size, generator=gen) * (2.0 * scale / hidden_size**0.5)
    targets = torch.randint(0, vocab, (num_tokens,), generator=gen)
    targets[0], targets[-1] = vocab - 1, 0
    return hidden.to(device, dtype), weight.to(device, dtype), targets.to(device)
