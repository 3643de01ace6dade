"""Token-list generation for agent loops: many prompts of different lengths, each with its own token budget, one
continuation each (``n`` = 1), on the engines of :mod:`npu_rl.rollout`.

- ``vllm``: one ``LLM.generate`` call with a ``SamplingParams`` per request (its own ``max_tokens``), so a long
  conversation never asks for more than ``max_model_len``. TP > 1 is not supported on this path yet.
- ``hf``: the prompts are left-padded into one batch and generated to the largest budget, then each continuation is
  cut to its own budget and at its first stop id.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch

from npu_rl.protocol import Batch
from npu_rl.rollout.base import SamplingParams


def generate_token_lists(engine, token_lists: Sequence[Sequence[int]], max_tokens: Sequence[int],
                         sampling: SamplingParams, pad_token_id: int
                         ) -> list[tuple[list[int], list[float] | None]]:
    """``[(token ids, log-probs or None)]`` in request order; ``sampling.n`` and ``max_new_tokens`` are ignored."""
    if len(token_lists) != len(max_tokens):
        raise ValueError("generate_token_lists: one budget per request")
    if not token_lists:
        return []
    if hasattr(engine, "llm"):
        return _vllm(engine, token_lists, max_tokens, sampling)
    return _batched(engine, token_lists, max_tokens, sampling, pad_token_id)


def _vllm(engine, token_lists, max_tokens, sampling: SamplingParams):
    from vllm.inputs import TokensPrompt

    from npu_rl.rollout.vllm_engine import _sampled_logprobs, _vllm_sampling_params

    if engine.tp_size > 1:
        raise NotImplementedError("agent-loop rollouts with tensor_model_parallel_size > 1 are not supported yet")
    if engine._asleep_level:
        raise RuntimeError("the vllm rollout engine is asleep: call wake_up() before generating")
    params = [_vllm_sampling_params(replace(sampling, max_new_tokens=max(1, int(m))), 1) for m in max_tokens]
    outputs = engine.llm.generate([TokensPrompt(prompt_token_ids=list(map(int, ids))) for ids in token_lists],
                                  params, use_tqdm=False)
    results = []
    for output, budget in zip(outputs, max_tokens):
        completion = output.outputs[0]
        ids = list(completion.token_ids)[: int(budget)]
        logprobs = _sampled_logprobs(completion)[: len(ids)] if sampling.return_logprobs else None
        results.append((_cut_at_stop(ids, sampling.stop_token_ids), logprobs))
    return [(ids, lp[: len(ids)] if lp is not None else None) for ids, lp in results]


def _cut_at_stop(ids: list[int], stop_ids: Sequence[int]) -> list[int]:
    stops = set(int(s) for s in stop_ids)
    for i, token in enumerate(ids):
        if token in stops:
            return ids[: i + 1]
    return ids


def _batched(engine, token_lists, max_tokens, sampling: SamplingParams, pad_token_id: int):
    width = max(len(ids) for ids in token_lists)
    input_ids = torch.full((len(token_lists), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(token_lists), width), dtype=torch.long)
    for row, ids in enumerate(token_lists):
        if ids:
            input_ids[row, width - len(ids):] = torch.as_tensor(list(ids), dtype=torch.long)
            attention_mask[row, width - len(ids):] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    batch = Batch({"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids})
    out = engine.generate(batch, replace(sampling, n=1, max_new_tokens=max(1, max(int(m) for m in max_tokens))))
    responses, mask = out["responses"].cpu(), out["response_mask"].cpu().bool()
    logprobs = out["rollout_logprobs"].cpu() if "rollout_logprobs" in out.tensors else None
    results = []
    for row, budget in enumerate(max_tokens):
        ids = responses[row][mask[row]].tolist()[: int(budget)]
        lp = logprobs[row][: len(ids)].tolist() if logprobs is not None else None
        results.append((ids, lp))
    return results
