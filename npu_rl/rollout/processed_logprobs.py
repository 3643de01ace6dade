"""Rollout log-probs "as the sampler saw them", computed on our side when the engine returns raw ones.

The rollout log-prob of a sampled token must be taken under the distribution it was drawn from: logits divided by
the temperature, then top-k, then top-p, renormalised over the kept tokens (vLLM's ``processed_logprobs``). vLLM
(GPU, CPU) honours ``LLM(logprobs_mode="processed_logprobs")``. vllm-ascend does not: its model runner builds
``AscendSampler()`` without passing the mode, so the sampler keeps its default ``raw_logprobs`` (log-softmax of the
logits before temperature / top-k / top-p; seen in ``vllm_ascend/worker/model_runner_v1.py`` and
``vllm_ascend/sample/sampler.py`` of its main branch, 2026-11, and every release before). There:

- with neutral sampling (temperature 1, top-k off, top-p 1; or greedy) raw and processed are the same numbers;
- otherwise the engine asks vLLM for the ``K`` most likely tokens' raw log-probs at every step and
  :func:`processed_from_raw` rebuilds the processed log-prob: exact when top-k is on and ``K >= top_k`` (the kept
  set is among the candidates), or when the candidates hold all the probability mass; otherwise an estimate (the
  tail beyond the candidates is folded in as one block), flagged per token.

Never run on vllm-ascend here (no NPU); the conversion is tested against a full-vocabulary reference on CPU.
"""

from __future__ import annotations

import math

import torch

from npu_rl.device.vllm_logprobs import sampler_gives_processed_logprobs  # noqa: F401 (re-exported)

DEFAULT_CANDIDATES = 20  # vLLM's default max_logprobs


def neutral_sampling(temperature: float, top_k: int, top_p: float, greedy: bool) -> bool:
    """Raw and processed log-probs coincide (vLLM records unscaled log-probs for greedy decoding too)."""
    return greedy or (temperature == 1.0 and top_k <= 0 and top_p >= 1.0)


def candidates_needed(top_k: int) -> int:
    """How many top raw log-probs to ask vLLM for at each step."""
    return max(DEFAULT_CANDIDATES, max(0, top_k))


def processed_from_raw(sampled_raw: torch.Tensor, candidates_raw: torch.Tensor, temperature: float, top_k: int,
                       top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(processed log-probs [N], exact [N] bool) from raw log-probs: of the sampled tokens [N] and of each step's
    top ``K`` tokens [N, K], sorted descending, ``-inf`` where fewer were returned.

    Scaled log-probs ``raw / T`` differ from ``logits / T`` by a constant per step, so softmax over them is the
    tempered distribution. top-k keeps the first ``top_k`` candidates; top-p then drops a token when the mass of the
    tokens above it is already ``>= top_p`` (vLLM's rule: sorted ascending, drop while the cumulative mass of the
    token and those below it is ``<= 1 - top_p``). The tail beyond the candidates (raw mass ``1 - sum exp(raw)``)
    counts only when top-k is off; its tempered mass is estimated as ``tail * p_min^(1/T - 1)`` with ``p_min`` the
    smallest candidate probability (exact at ``T = 1``), and top-p keeps or drops it as one block."""
    raw = candidates_raw.double()
    num = raw.shape[-1]
    complete_by_top_k = 0 < top_k <= num
    if top_k > 0:
        raw = raw[:, :min(top_k, num)]
    scaled = raw / temperature
    tail_raw = (1.0 - raw.exp().sum(-1)).clamp(min=0.0) if not complete_by_top_k else torch.zeros(len(raw))
    p_min = raw.exp().min(-1).values.clamp(min=1e-300)
    tail_scaled = tail_raw * p_min.pow(1.0 / temperature - 1.0)
    no_tail = torch.full_like(tail_scaled, -math.inf)
    log_tail = torch.where(tail_scaled > 0, tail_scaled.clamp(min=1e-300).log(), no_tail)
    everything = torch.cat([scaled, log_tail.unsqueeze(-1)], dim=-1)  # the tail as one block, smallest last
    probs = torch.softmax(everything, dim=-1)
    mass_above = probs.cumsum(-1) - probs  # mass of the tokens (and blocks) before each one
    keep = (mass_above < top_p) if top_p < 1.0 else torch.ones_like(probs, dtype=torch.bool)
    keep[:, 0] = True
    kept = torch.where(keep, everything, torch.full_like(everything, -math.inf))
    processed = sampled_raw.double() / temperature - torch.logsumexp(kept, dim=-1)
    tail_used = keep[:, -1] & (tail_raw > 1e-9)
    exact = complete_by_top_k | ~tail_used | (temperature == 1.0 and top_p >= 1.0)
    return processed.to(sampled_raw.dtype), exact


def from_vllm_step(step: dict, token: int, num_candidates: int) -> tuple[float, list[float]]:
    """(raw log-prob of ``token``, the top ``num_candidates`` raw log-probs, descending) from one step of a vLLM
    completion's ``logprobs`` (``{token_id: Logprob(logprob, rank, ...)}``: the sampled token and the top ``K``)."""
    top = sorted((entry for entry in step.values() if entry.rank is not None and entry.rank <= num_candidates),
                 key=lambda entry: entry.rank)
    return float(step[token].logprob), [float(entry.logprob) for entry in top]
