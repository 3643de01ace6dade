"""Masked statistics and loss aggregation (``loss_agg_mode``), invariant to how a batch is split.

Aggregation modes (verl's names, config key ``actor_rollout_ref.actor.loss_agg_mode``, default ``token-mean``;
``critic.loss_agg_mode`` follows it), for a per-token loss ``l[b, t]`` and mask ``m[b, t]``::

    token-mean               sum_{b,t} m l / N_tok
    token-sum                sum_{b,t} m l                            (no normalisation; verl >= 0.9)
    seq-mean-token-sum       sum_b ( sum_t m l ) / N_seq
    seq-mean-token-mean      sum_b ( sum_t m l / sum_t m ) / N_seq
    seq-mean-token-sum-norm  sum_b ( sum_t m l ) / N_seq / S         (Dr. GRPO, arXiv:2503.20783)

``N_tok`` is the number of valid tokens and ``N_seq`` the number of sequences with at least one valid token, both
counted over the WHOLE batch that one optimizer step averages over (every micro-batch on every data-parallel rank).
The caller passes them in (``global_num_tokens``, ``global_num_seqs``; plain numbers or 0-d tensors) and this code
never communicates. Each micro-batch then returns its share of the global mean, so the gradients of the shares add
up, over micro-batches and ranks, to the gradient of the mean over the whole batch, however the batch was split.
Left out, they default to the micro-batch's own counts (right for a single micro-batch on a single rank).

Data-parallel gradient reduction that AVERAGES over ``world_size`` ranks (FSDP's default) divides the sum by
``world_size``: a caller using it multiplies the loss by ``world_size`` (verl's ``dp_size`` factor), or passes
``global_num_tokens / world_size``.

``S`` (``loss_scale_factor``) defaults to the mask's padded width ``T``, as in verl; pass a constant (the maximum
response length) when micro-batches may be padded to different widths, or the result will depend on the split.

A denominator of zero (nothing valid anywhere) gives a loss of zero, not NaN. Nothing here calls ``.item()``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

Denominator = int | float | torch.Tensor | None

LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


class LossOutput(NamedTuple):
    """What every loss returns: the term to add to the loss, and detached 0-d metric tensors."""

    loss: torch.Tensor  # 0-d, this micro-batch's share of the global loss
    metrics: dict[str, torch.Tensor]
    # [B, T] per-token KL(pi || pi_ref) when an implementation computed it in the same pass as the loss (a fused
    # kernel given PolicyLossInputs.ref_logprobs); the KL loss term then uses it instead of recomputing it.
    token_kl: torch.Tensor | None = None


def check_loss_agg_mode(name: str) -> None:
    """Raise ValueError unless ``name`` is one of :data:`LOSS_AGG_MODES`."""
    if name not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {name!r}; known: {', '.join(LOSS_AGG_MODES)}")


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is non-zero; NaN/inf outside the mask cannot leak in."""
    valid = torch.where(mask.bool(), values, torch.zeros_like(values))
    return valid.sum() if dim is None else valid.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over the mask; an empty mask (or empty row, with ``dim``) gives 0."""
    count = mask.to(values.dtype).sum() if dim is None else mask.to(values.dtype).sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over the mask (Bessel-corrected when ``unbiased``); fewer than two valid entries give 0."""
    mean = masked_mean(values, mask)
    count = mask.to(values.dtype).sum()
    squares = masked_sum((values - mean) ** 2, mask)
    return squares / ((count - 1) if unbiased else count).clamp(min=1)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """``(x - mean) / sqrt(var + 1e-8)`` with mean and unbiased variance over the mask, as verl whitens advantages.

    With one valid entry the variance is 0 and the result is 0 (verl raises there). Entries outside the mask are
    transformed too; callers multiply by the mask.
    """
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + 1e-8)
    return whitened if shift_mean else whitened + mean


def loss_denominators(loss_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """This shard's ``global_num_tokens`` and ``global_num_seqs`` (0-d tensors) for ``loss_mask`` [B, T].

    Add them over the micro-batches of one optimizer step (and all-reduce them over ranks) to get the global ones.
    """
    mask = loss_mask.bool()
    return {"global_num_tokens": mask.sum(), "global_num_seqs": mask.any(dim=-1).sum()}


def _safe(denominator: Denominator, default: torch.Tensor) -> Denominator:
    """Use the local count when none is given; replace a zero denominator by 1 (the numerator is then 0)."""
    if denominator is None:
        return default.clamp(min=1)
    if isinstance(denominator, torch.Tensor):
        return torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    return denominator if denominator > 0 else 1


def agg_loss(
    *,
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    global_num_tokens: Denominator = None,
    global_num_seqs: Denominator = None,
    loss_scale_factor: Denominator = None,
) -> torch.Tensor:
    """Reduce a per-token loss ``loss_mat`` [B, T] over ``loss_mask`` [B, T] to this shard's share (0-d).

    See the module docstring for the modes and denominators.
    """
    check_loss_agg_mode(loss_agg_mode)
    mask = loss_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        return masked_sum(loss_mat, loss_mask) / _safe(global_num_tokens, mask.sum())
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask)
    tokens_per_seq = mask.sum(dim=-1)  # [B]
    seq_losses = masked_sum(loss_mat, loss_mask, dim=-1)  # [B]
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_losses / tokens_per_seq.clamp(min=1)
    loss = seq_losses.sum() / _safe(global_num_seqs, (tokens_per_seq > 0).sum())
    if loss_agg_mode == "seq-mean-token-sum-norm":
        loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    return loss
