"""Partial rollouts: rows whose generation stopped before their end (an interrupt at a weight push), and how they
continue from where they stopped (pure tensor helpers; the rollout pool and the engines use them).

A row in the rollout layout (:mod:`npu_rl.rollout.base`) is **unfinished** when its response neither ends with a stop
token nor fills the response width ``R``: it holds ``L < R`` tokens (``response_mask`` is 1 on exactly those) and
their ``rollout_logprobs``. It continues with the prompt's real tokens + those ``L`` tokens as the new context
(:func:`continuation_prompts`) and a budget of ``R - L`` tokens; :func:`merge_continuation` appends the new tokens and
their log-probs behind the kept ones, so no token is generated twice and each token's log-prob stays the one recorded
when it was sampled (under the weights that sampled it).

Engines honour an interrupt in one of two ways (``RolloutEngine.generate(..., should_stop=)``):

- ``hf``: checked after every decode step (a transformers stopping criterion); the call returns at once with the
  tokens so far.
- ``vllm`` (the offline ``LLM``, which cannot be stopped inside a call): generates in segments of
  ``ceil(R / SEGMENTS_PER_RESPONSE)`` tokens and checks between them (:func:`generate_in_segments`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Sequence

import torch

from npu_rl.protocol import Batch
from npu_rl.rollout.utils import left_padded_prompts

SEGMENTS_PER_RESPONSE = 8
"""An engine that cannot stop inside a call generates a response in up to this many segments when it may be
interrupted, so a push waits at most about 1/8 of a full-length generation."""


def response_lengths(rows: Batch) -> torch.Tensor:
    """Tokens each row holds (up to and including its stop token). [rows] int64"""
    return rows["response_mask"].long().sum(dim=1)


def unfinished_rows(rows: Batch, stop_token_ids: Sequence[int]) -> torch.Tensor:
    """Rows whose response neither ends at a stop token nor fills the response width. [rows] bool"""
    responses, lengths = rows["responses"], response_lengths(rows)
    width = responses.shape[1]
    last = responses.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    stops = torch.as_tensor(list(stop_token_ids), dtype=responses.dtype, device=responses.device)
    ended = (lengths > 0) & torch.isin(last, stops) if len(stop_token_ids) else torch.zeros_like(lengths, dtype=torch.bool)
    return ~ended & (lengths < width)


def continuation_prompts(rows: Batch, pad_token_id: int) -> Batch:
    """Each row's prompt (its real tokens) followed by the response tokens it holds, left-padded: the context a row
    continues from (``input_ids``, ``attention_mask``, ``position_ids``)."""
    prompt_length = rows["prompts"].shape[1]
    prompt_mask = rows["attention_mask"][:, :prompt_length].bool()
    lengths = response_lengths(rows).tolist()
    contexts = [prompt[keep].tolist() + response[:length].tolist()
                for prompt, keep, response, length in zip(rows["prompts"], prompt_mask, rows["responses"], lengths)]
    return left_padded_prompts(contexts, pad_token_id)


def merge_continuation(rows: Batch, continued: Batch, pad_token_id: int) -> Batch:
    """``rows`` with the continuation's tokens appended behind the ones they hold, cut to the response width.

    ``continued``: the engine's output for :func:`continuation_prompts` of ``rows`` (one row each, same order).
    Returns the merged rows: ``responses``, ``response_mask``, ``input_ids``, ``attention_mask`` and
    ``rollout_logprobs`` rebuilt (the held tokens and log-probs unchanged), every other field kept."""
    if len(continued) != len(rows):
        raise ValueError(f"merge_continuation: {len(continued)} continued rows for {len(rows)} partial rows")
    responses, width = rows["responses"], rows["responses"].shape[1]
    held = response_lengths(rows)
    new_ids, new_lengths = continued["responses"].to(responses.device), response_lengths(continued).to(held.device)
    positions = torch.arange(width, device=responses.device).unsqueeze(0)  # [1, R]
    source = (positions - held.unsqueeze(1)).clamp(min=0)  # where position p of the merged row comes from
    in_new = positions >= held.unsqueeze(1)
    new_width = new_ids.shape[1]
    gather_at = source.clamp(max=max(new_width - 1, 0))
    appended = new_ids.gather(1, gather_at) if new_width else torch.full_like(responses, pad_token_id)
    lengths = held + torch.minimum(new_lengths, width - held)
    mask = positions < lengths.unsqueeze(1)
    merged = torch.where(in_new, appended, responses).masked_fill(~mask, pad_token_id)
    out = Batch(dict(rows.tensors), dict(rows.non_tensors), dict(rows.meta))
    prompt_length = rows["prompts"].shape[1]
    mask_dtype = rows["response_mask"].dtype
    out["responses"] = merged
    out["response_mask"] = mask.to(mask_dtype)
    out["input_ids"] = torch.cat([rows["prompts"], merged], dim=1)
    out["attention_mask"] = torch.cat([rows["attention_mask"][:, :prompt_length], mask.to(mask_dtype)], dim=1)
    if "rollout_logprobs" in rows:
        if "rollout_logprobs" not in continued:
            raise ValueError("merge_continuation: the partial rows hold rollout_logprobs, the continuation has none")
        old = rows["rollout_logprobs"]
        new = continued["rollout_logprobs"].to(old.device, old.dtype)
        tail = new.gather(1, gather_at) if new_width else torch.zeros_like(old)
        out["rollout_logprobs"] = torch.where(in_new, tail, old).masked_fill(~mask, 0.0)
    return out


def continue_rows(generate: Callable[[Batch, object], Batch], rows: Batch, sampling, pad_token_id: int,
                  budget: int | None = None) -> Batch:
    """Continue ``rows`` (all unfinished) by one ``generate(prompts, sampling)`` call of at most ``budget`` new tokens
    (None: the rest of the response width); returns the merged rows."""
    width = rows["responses"].shape[1]
    room = width - int(response_lengths(rows).min())
    new_tokens = room if budget is None else min(room, int(budget))
    continued = generate(continuation_prompts(rows, pad_token_id), replace(sampling, n=1, max_new_tokens=new_tokens))
    return merge_continuation(rows, continued, pad_token_id)


def segment_tokens(response_length: int) -> int:
    return max(1, math.ceil(response_length / SEGMENTS_PER_RESPONSE))


def generate_in_segments(generate: Callable[[Batch, object], Batch], prompts: Batch, sampling, pad_token_id: int,
                         should_stop: Callable[[], bool]) -> Batch:
    """For an engine that cannot stop inside a call: the response in segments, ``should_stop`` checked between them.
    ``generate(prompts, sampling) -> rows``; returns rows of width ``sampling.max_new_tokens``, some unfinished when
    ``should_stop`` said so."""
    width = int(sampling.max_new_tokens)
    step = segment_tokens(width)
    rows = widen(generate(prompts, replace(sampling, max_new_tokens=min(step, width))), width, pad_token_id)
    stop_ids = sampling.stop_token_ids
    while True:
        todo = unfinished_rows(rows, stop_ids)
        if not bool(todo.any()) or should_stop():
            return rows
        index = torch.nonzero(todo).squeeze(1)
        merged = continue_rows(generate, rows.index(index), sampling, pad_token_id, budget=step)
        rows = scatter_rows(rows, index, merged)


def widen(rows: Batch, width: int, pad_token_id: int) -> Batch:
    """Rows whose responses are narrower than ``width`` padded to it (masked, pad ids, zero log-probs)."""
    have = rows["responses"].shape[1]
    if have == width:
        return rows
    extra = width - have
    out = Batch(dict(rows.tensors), dict(rows.non_tensors), dict(rows.meta))
    pad = lambda t, value: torch.nn.functional.pad(t, (0, extra), value=value)  # noqa: E731
    out["responses"] = pad(rows["responses"], pad_token_id)
    out["response_mask"] = pad(rows["response_mask"], 0)
    out["input_ids"] = pad(rows["input_ids"], pad_token_id)
    out["attention_mask"] = pad(rows["attention_mask"], 0)
    positions = rows["position_ids"]
    offsets = torch.arange(1, extra + 1, device=positions.device, dtype=positions.dtype)
    out["position_ids"] = torch.cat([positions, positions[:, -1:] + offsets.unsqueeze(0)], dim=1)
    if "rollout_logprobs" in rows:
        out["rollout_logprobs"] = pad(rows["rollout_logprobs"], 0.0)
    return out


def scatter_rows(rows: Batch, index: torch.Tensor, updated: Batch) -> Batch:
    """``rows`` with rows ``index`` replaced by ``updated`` (same fields)."""
    out = Batch(dict(rows.tensors), dict(rows.non_tensors), dict(rows.meta))
    for key, value in rows.tensors.items():
        merged = value.clone()
        merged[index.to(value.device)] = updated[key].to(value.device, value.dtype)
        out[key] = merged
    for key, value in rows.non_tensors.items():
        merged = value.copy()
        merged[index.cpu().numpy()] = updated[key]
        out[key] = merged
    return out


def split_complete_groups(rows: Batch, n: int) -> tuple[Batch, Batch]:
    """Rows in groups of ``n`` (a prompt's samples, consecutive) -> (groups with no ``unfinished`` row, the other
    groups whole), both in their order."""
    if len(rows) % n:
        raise ValueError(f"split_complete_groups: {len(rows)} rows are not groups of n={n}")
    complete = ~rows["unfinished"].bool().view(-1, n).any(dim=1)  # [groups]
    per_row = complete.repeat_interleave(n)
    return rows.index(torch.nonzero(per_row).squeeze(1)), rows.index(torch.nonzero(~per_row).squeeze(1))
