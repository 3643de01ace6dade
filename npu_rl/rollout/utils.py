"""Pure tensor helpers shared by the rollout engines, and the rollout-vs-actor mismatch metrics.

Conventions (see :mod:`npu_rl.rollout.base` for the batch fields):

- A response ends at its FIRST end-of-turn token, which belongs to the response (mask 1); every position after it
  is masked (0) and holds ``pad_token_id``. Masks never come from comparing ids with the pad id: SmolLM2's pad and
  end-of-turn are the same id (2), so "not pad" would drop the end token and keep nothing after a pad-led prompt.
- Response position ids continue the prompt's: ``last prompt position + 1 .. + R`` (left padding leaves the last
  prompt column holding the last real position). With 3-D rotary ids ([B, 3, P], a Qwen-VL prompt whose last token
  is text, so its three ids are equal) each axis continues the same way, as transformers' rope deltas do.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from npu_rl.device import get_backend
from npu_rl.protocol import Batch


def to_plain(value: Any) -> Any:
    """DictConfig / ListConfig / nested dataclass-free mappings -> plain dicts and lists."""
    if hasattr(value, "items"):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [to_plain(v) for v in value]
    return value


def prompt_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded prompt: 0, 1, ... on real tokens, 0 on the padding. [B, P] -> [B, P]"""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def first_stop_response_mask(
    responses: torch.Tensor,
    stop_token_ids: Sequence[int],
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """1 on response tokens up to and including the first stop token, 0 after it (and past ``lengths``).

    responses: [N, R] token ids; lengths: [N] number of generated tokens per row (None: all R).
    Returns a bool mask [N, R].
    """
    num_rows, max_len = responses.shape
    positions = torch.arange(max_len, device=responses.device).unsqueeze(0)  # [1, R]
    valid = positions < (lengths.to(responses.device).unsqueeze(1) if lengths is not None else max_len)
    if len(stop_token_ids):
        stops = torch.as_tensor(list(stop_token_ids), device=responses.device, dtype=responses.dtype)
        is_stop = torch.isin(responses, stops) & valid  # [N, R]
        # Stops strictly before each position: 0 up to and including the first stop, >= 1 after it.
        stops_before = is_stop.long().cumsum(dim=-1) - is_stop.long()
        return valid & (stops_before == 0)
    return valid.expand(num_rows, max_len).clone()


def assemble_rollout_batch(
    prompts: Batch,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    n: int,
    pad_token_id: int,
    rollout_logprobs: torch.Tensor | None = None,
) -> Batch:
    """The engine output: prompts repeated ``n`` times (interleaved) + responses, masks and position ids.

    responses / response_mask / rollout_logprobs: [B*n, R], rows in interleaved order (prompt 0's samples first).
    Positions after the first stop are set to ``pad_token_id`` (ids) and 0 (log-probs) here.
    """
    rows = prompts.repeat(n, interleave=True)
    prompt_ids = rows.pop("input_ids")
    prompt_mask = rows.pop("attention_mask")
    prompt_positions = rows.pop("position_ids") if "position_ids" in rows.tensors else prompt_position_ids(prompt_mask)
    if responses.shape[0] != prompt_ids.shape[0]:
        raise ValueError(f"engine returned {responses.shape[0]} responses for {prompt_ids.shape[0]} prompt rows "
                         f"({prompt_ids.shape[0] // max(n, 1)} prompts x n={n})")
    device = prompt_ids.device
    response_mask = response_mask.to(device)
    responses = responses.to(device).masked_fill(~response_mask.bool(), pad_token_id)
    mask_dtype = prompt_mask.dtype
    response_length = responses.shape[1]
    offsets = torch.arange(1, response_length + 1, device=device, dtype=prompt_positions.dtype)
    response_positions = prompt_positions[..., -1:] + offsets  # [B*n, R] or [B*n, 3, R]
    out = {
        "prompts": prompt_ids,
        "responses": responses,
        "response_mask": response_mask.to(mask_dtype),
        "input_ids": torch.cat([prompt_ids, responses], dim=-1),
        "attention_mask": torch.cat([prompt_mask, response_mask.to(mask_dtype)], dim=-1),
        "position_ids": torch.cat([prompt_positions, response_positions], dim=-1),
    }
    if rollout_logprobs is not None:
        out["rollout_logprobs"] = rollout_logprobs.to(device=device, dtype=torch.float32).masked_fill(
            ~response_mask.bool(), 0.0)
    for key, value in out.items():
        rows[key] = value
    return rows


def rollout_probs_diff_metrics(
    rollout_logprobs: torch.Tensor,
    actor_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """How far the rollout engine's token probabilities are from the actor's recomputed ones (verl's names).

    All inputs [N, R]; the statistics run over response tokens (``response_mask``) of |p_rollout - p_actor| with
    p = exp(logprob). Returns 0-dim tensors (no ``.item()``: no host sync; the tracker converts them):
    ``training/rollout_probs_diff_{mean,max,std}``; std is unbiased (n - 1), as ``torch.std`` in verl.

    With top-p < 1 or top-k > 0 the rollout log-probs are those of the truncated, renormalised sampling
    distribution, so they sit above the actor's full-vocabulary ones: the metric then measures the truncation as
    well as numerical mismatch. With top_p=1, top_k=-1 it is numerics only (engine kernels, dtype, batch shape).
    """
    mask = response_mask.to(torch.float32)
    diff = (rollout_logprobs.float().exp() - actor_logprobs.float().exp()).abs() * mask
    count = mask.sum()
    mean = diff.sum() / count.clamp(min=1.0)
    variance = (((diff - mean) * mask) ** 2).sum() / (count - 1.0).clamp(min=1.0)
    return {
        "training/rollout_probs_diff_mean": mean,
        "training/rollout_probs_diff_max": diff.max() if diff.numel() else diff.new_zeros(()),
        "training/rollout_probs_diff_std": variance.sqrt(),
    }


def device_memory_used_gb() -> float:
    """Memory in use on this process's device (GiB), from the device layer: total - free (host memory on CPU)."""
    free, total = get_backend().mem_get_info()
    return (total - free) / 2**30


def cut_at_stop(ids: list[int], stop_ids: Sequence[int]) -> list[int]:
    """``ids`` up to and including the first stop id (all of them when none occurs)."""
    stops = set(int(s) for s in stop_ids)
    for i, token in enumerate(ids):
        if token in stops:
            return ids[: i + 1]
    return ids


def left_padded_prompts(token_lists: Sequence[Sequence[int]], pad_token_id: int) -> Batch:
    """Token-id lists of different lengths as one left-padded prompt batch (``input_ids``, ``attention_mask``,
    ``position_ids`` [N, longest])."""
    width = max(len(ids) for ids in token_lists)
    input_ids = torch.full((len(token_lists), width), int(pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros((len(token_lists), width), dtype=torch.long)
    for row, ids in enumerate(token_lists):
        if ids:
            input_ids[row, width - len(ids):] = torch.as_tensor(list(ids), dtype=torch.long)
            attention_mask[row, width - len(ids):] = 1
    return Batch({"input_ids": input_ids, "attention_mask": attention_mask,
                  "position_ids": prompt_position_ids(attention_mask)})


def check_token_requests(token_lists: Sequence[Sequence[int]], max_tokens: Sequence[int]) -> None:
    if len(token_lists) != len(max_tokens):
        raise ValueError(f"generate_token_lists: {len(token_lists)} requests but {len(max_tokens)} budgets "
                         "(one budget per request)")
