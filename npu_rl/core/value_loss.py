"""Clipped value loss (the critic's) and the entropy bonus (the actor's).

Value loss (PPO's clipped value objective, as in OpenAI baselines / TRL / verl; config ``critic.cliprange_value``,
default 0.5, and ``critic.loss_agg_mode``)::

    v_clip = clip(v, v_old - c, v_old + c)          v: predicted_values, v_old: old_values, R: returns
    loss   = 0.5 * agg( max((v - R)^2, (v_clip - R)^2) )

``vf_clipfrac`` is the fraction of valid tokens where the clipped term is the larger one.

Entropy: ``H_t = logsumexp(z_t) - sum_v softmax(z_t)_v z_{t,v}`` per token. The actor ADDS ``-entropy_coeff * agg(H)``
(``actor.entropy_coeff``, default 0) to its loss, which raises entropy when the coefficient is positive.

Denominators follow :mod:`npu_rl.core.aggregation`; metrics are detached 0-d tensors (no ``.item()``).
"""

from __future__ import annotations

import torch

from npu_rl.core.aggregation import Denominator, LossOutput, agg_loss, masked_mean


def value_loss(
    *,
    predicted_values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    global_num_tokens: Denominator = None,
    global_num_seqs: Denominator = None,
    loss_scale_factor: Denominator = None,
) -> LossOutput:
    """Clipped value loss. ``predicted_values`` [B, T]: the critic now (with grad); ``old_values`` [B, T]: the
    critic at rollout time (verl's ``values``); ``returns`` [B, T]: the targets. Metrics: ``vf_clipfrac``."""
    lower, upper = old_values - cliprange_value, old_values + cliprange_value
    clipped_values = torch.maximum(torch.minimum(predicted_values, upper), lower)
    unclipped_losses = (predicted_values - returns) ** 2
    clipped_losses = (clipped_values - returns) ** 2
    losses = torch.maximum(unclipped_losses, clipped_losses)
    loss = 0.5 * agg_loss(
        loss_mat=losses,
        loss_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        loss_scale_factor=loss_scale_factor,
    )
    clipfrac = masked_mean((clipped_losses > unclipped_losses).to(losses.dtype), response_mask)
    return LossOutput(loss, {"vf_clipfrac": clipfrac.detach()})


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over the last dim: [..., V] -> [...] (a reference; fused kernels live elsewhere)."""
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def entropy_bonus(
    *,
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    entropy_coeff: float,
    loss_agg_mode: str = "token-mean",
    global_num_tokens: Denominator = None,
    global_num_seqs: Denominator = None,
    loss_scale_factor: Denominator = None,
) -> LossOutput:
    """The term ``-entropy_coeff * agg(entropy)`` to add to the actor's loss; ``entropy`` [B, T] per token.

    Metrics: ``entropy``, the mean over this micro-batch's valid tokens.
    """
    aggregated = agg_loss(
        loss_mat=entropy,
        loss_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        loss_scale_factor=loss_scale_factor,
    )
    return LossOutput(-entropy_coeff * aggregated, {"entropy": masked_mean(entropy, response_mask).detach()})
