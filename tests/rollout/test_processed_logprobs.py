"""Processed rollout log-probs rebuilt from raw ones (vllm-ascend's sampler returns raw): against the full-vocabulary
warping, temperature then top-k then top-p (vLLM's order and top-p rule)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from npu_rl.rollout.processed_logprobs import from_vllm_step, neutral_sampling, processed_from_raw

VOCAB, STEPS = 50, 64


def reference(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """log_softmax of the warped logits over the whole vocabulary (the plain computation)."""
    z = logits / temperature
    if top_k > 0:
        kth = z.topk(top_k, dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        ascending, order = z.sort(dim=-1)
        drop = ascending.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[:, -1] = False
        z = z.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
    return z.log_softmax(-1)


def case(temperature, top_k, top_p, num_candidates, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(STEPS, VOCAB, generator=gen, dtype=torch.float64)
    warped = reference(logits, temperature, top_k, top_p)
    tokens = torch.multinomial(warped.exp(), 1, generator=gen).squeeze(-1)
    raw = logits.log_softmax(-1)
    candidates = raw.topk(num_candidates, dim=-1).values
    processed, exact = processed_from_raw(raw.gather(-1, tokens[:, None]).squeeze(-1), candidates, temperature,
                                          top_k, top_p)
    return processed, exact, warped.gather(-1, tokens[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.7, 5, 1.0), (1.3, 8, 0.9), (0.6, 20, 0.8), (1.0, 3, 0.5)])
def test_exact_with_top_k_within_the_candidates(temperature, top_k, top_p):
    processed, exact, expected = case(temperature, top_k, top_p, num_candidates=20)
    assert exact.all()
    assert_close(processed, expected)


@pytest.mark.parametrize("temperature, top_p", [(0.7, 1.0), (1.2, 0.9), (1.0, 0.95)])
def test_exact_when_the_candidates_hold_every_token(temperature, top_p):
    processed, exact, expected = case(temperature, -1, top_p, num_candidates=VOCAB)
    assert exact.all()
    assert_close(processed, expected)


def test_estimate_is_flagged_when_the_tail_matters():
    # temperature without top-k and only 10 of 50 tokens known: the tail's tempered mass is an estimate
    processed, exact, expected = case(0.7, -1, 1.0, num_candidates=10, seed=1)
    assert not exact.all()
    assert_close(processed[exact], expected[exact])
    assert (processed - expected).abs().max() < 0.5  # an estimate, not garbage


def test_neutral_sampling():
    assert neutral_sampling(1.0, -1, 1.0, greedy=False) and neutral_sampling(0.0, 5, 0.5, greedy=True)
    assert not neutral_sampling(0.7, -1, 1.0, greedy=False) and not neutral_sampling(1.0, 5, 1.0, greedy=False)
    # at temperature 1 without truncation the raw numbers are already the processed ones
    processed, exact, expected = case(1.0, -1, 1.0, num_candidates=5)
    assert exact.all()
    assert_close(processed, expected)


def test_vllm_completion_is_converted():
    """A vLLM completion as the engine reads it: per step {token: Logprob(logprob, rank)}, the sampled token's entry
    may lie outside the top K (its rank > K) and must not count as a candidate."""
    from types import SimpleNamespace as Entry

    from npu_rl.rollout.base import SamplingParams
    from npu_rl.rollout.vllm_engine import _processed_logprobs

    gen = torch.Generator().manual_seed(2)
    raw = (3 * torch.randn(3, VOCAB, generator=gen, dtype=torch.float64)).log_softmax(-1)
    ids = [int(raw[0].argmax()), int(raw[1].argsort(descending=True)[1]), int(raw[2].argsort(descending=True)[30])]
    steps = []
    for step, token in zip(raw, ids):
        order = step.argsort(descending=True).tolist()
        entries = {t: Entry(logprob=float(step[t]), rank=r + 1) for r, t in enumerate(order[:4])}
        entries[token] = Entry(logprob=float(step[token]), rank=order.index(token) + 1)
        steps.append(entries)
    completion = Entry(logprobs=steps)
    sampling = SamplingParams(temperature=0.5, top_k=4, top_p=1.0, max_new_tokens=3)
    values, exact = _processed_logprobs(completion, ids[:2], sampling, candidates=4)
    expected = reference(raw[:2], 0.5, 4, 1.0).gather(-1, torch.tensor(ids[:2])[:, None]).squeeze(-1)
    assert exact.all()
    assert_close(values, expected.float())
    assert from_vllm_step(steps[2], ids[2], 4)[1] == sorted((float(v) for v in raw[2].topk(4).values), reverse=True)
