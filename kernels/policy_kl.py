"""The per-token PPO policy loss and KL estimator in one pass over the ``[B, T]`` tensors.

Dual-clip PPO as verl's ``vanilla`` loss (Schulman et al. 2017, arXiv:1707.06347; dual clip: Ye et al. 2019,
arXiv:1912.09729), with ``A`` the advantages and the log-ratio clamped to [-20, 20] before ``exp``::

    r       = exp(clamp(logp - old_logp, -20, 20))
    pg1     = -A r;   pg2 = -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high);   cp1 = max(pg1, pg2)
    pg3     = -A clip_ratio_c;   pg = cp1 where A >= 0, min(pg3, cp1) where A < 0;   pg *= weights (optional)
    clipped = pg2 > pg1;   clipped_lower = (cp1 > pg3) and A < 0      (numerators of pg_clipfrac(_lower))

KL estimators of KL(pi || pi_ref) from sampled tokens (J. Schulman, http://joschu.net/blog/kl-approx.html), with
``d = logp - ref_logp``: ``kl``/``k1`` = d; ``abs`` = |d|; ``mse``/``k2`` = d^2 / 2; ``low_var_kl``/``k3`` =
exp(-d') + d' - 1 with d' = clamp(d, -20, 20), the value clamped to [-10, 10] (verl's clamps). A ``+`` suffix keeps
the value and takes k2's gradient (straight-through: ``k2 - sg[k2] + sg[value]``).

Gradients flow to ``logprobs`` only (old log-probs, advantages, reference log-probs and weights are constants), and
match torch autograd of the formulas above, ties included (``max`` / ``min`` split the gradient at ties, ``clamp``
passes it at the bounds). The torch path (:func:`policy_loss_and_kl_torch`) is the reference; the Triton path reads
each input once and writes each output once, forward and backward.
"""

from __future__ import annotations


import torch

from npu_rl.kernels import _device
from npu_rl.kernels.policy_types import KL_BASE_TYPES, KL_TYPES, PolicyKLOutput, _check_kl_type  # noqa: F401

def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kl_type: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate of type ``kl_type`` (module docstring), torch ops, autograd-differentiable."""
    base, straight_through = _check_kl_type(kl_type)
    diff = logprobs - ref_logprobs
    if base in ("kl", "k1"):
        value = diff
    elif base == "abs":
        value = diff.abs()
    elif base in ("mse", "k2"):
        value = 0.5 * diff.square()
    else:
        neg = (ref_logprobs - logprobs).clamp(min=-20.0, max=20.0)  # log(pi_ref / pi)
        value = (torch.exp(neg) - neg - 1.0).clamp(min=-10.0, max=10.0)
    if not straight_through or base in ("mse", "k2"):
        return value
    k2 = 0.5 * diff.square()
    return k2 - k2.detach() + value.detach()


def policy_loss_and_kl_torch(logprobs, old_logprobs, advantages, ref_logprobs=None, *, clip_ratio_low=0.2,
                             clip_ratio_high=0.2, clip_ratio_c=3.0, kl_type="low_var_kl",
                             weights=None) -> PolicyKLOutput:
    """Reference implementation (plain torch ops, autograd) of :func:`policy_loss_and_kl`."""
    log_ratio = (logprobs - old_logprobs).clamp(min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clip_pg1 = torch.maximum(pg1, pg2)
    pg3 = -advantages * clip_ratio_c
    clip_pg2 = torch.minimum(pg3, clip_pg1)
    pg_losses = torch.where(advantages < 0, clip_pg2, clip_pg1)
    if weights is not None:
        pg_losses = pg_losses * weights
    kl = None if ref_logprobs is None else kl_estimate(logprobs, ref_logprobs, kl_type)
    return PolicyKLOutput(
        pg_losses=pg_losses,
        kl=kl,
        clipped=torch.gt(pg2, pg1).float().detach(),
        clipped_lower=(torch.gt(clip_pg1, pg3) & (advantages < 0)).float().detach(),
        log_ratio=log_ratio.detach(),
    )


def policy_loss_and_kl(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    ref_logprobs: torch.Tensor | None = None,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    kl_type: str = "low_var_kl",
    weights: torch.Tensor | None = None,
    backend: str = "auto",
) -> PolicyKLOutput:
    """Per-token dual-clip PPO loss, KL estimate (when ``ref_logprobs`` is given) and clip flags, fused.

    All tensors ``[B, T]`` (any shape, all equal). ``weights``: optional per-token factors on the policy loss (verl's
    rollout importance weights). ``backend``: ``"auto" | "torch" | "triton"`` (``triton_mm`` means ``triton`` here).
    """
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_ratio_c}")
    _check_kl_type(kl_type)
    shapes = {tuple(t.shape) for t in (logprobs, old_logprobs, advantages, ref_logprobs, weights) if t is not None}
    if len(shapes) != 1:
        raise ValueError(f"policy_loss_and_kl needs equal shapes, got {sorted(shapes)}")
    kwargs = dict(clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c,
                  kl_type=kl_type, weights=weights)
    if _device.resolve_backend(backend, logprobs) == "torch":
        return policy_loss_and_kl_torch(logprobs, old_logprobs, advantages, ref_logprobs, **kwargs)
    from npu_rl.kernels.policy_triton import policy_loss_and_kl_triton

    return policy_loss_and_kl_triton(logprobs, old_logprobs, advantages, ref_logprobs, **kwargs)
