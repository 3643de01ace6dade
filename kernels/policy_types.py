"""What the torch and Triton paths of :mod:`npu_rl.kernels.policy_kl` share: the KL type names, their kernel codes
and the per-token output (kept apart so that the Triton module and the dispatcher do not import each other)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

KL_BASE_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_TYPES = KL_BASE_TYPES + tuple(name + "+" for name in KL_BASE_TYPES)
_KL_CODE = {"kl": 1, "k1": 1, "abs": 2, "mse": 3, "k2": 3, "low_var_kl": 4, "k3": 4}  # Triton's KL_KIND


@dataclass
class PolicyKLOutput:
    """Per-token results, all ``[B, T]`` float32; aggregate them with the response mask (the core's job)."""

    pg_losses: torch.Tensor  # differentiable w.r.t. logprobs
    kl: torch.Tensor | None  # differentiable w.r.t. logprobs; None without ref_logprobs
    clipped: torch.Tensor  # 0/1
    clipped_lower: torch.Tensor  # 0/1
    log_ratio: torch.Tensor  # clamped logp - old_logp; ppo_kl = masked_mean(-log_ratio)


def _check_kl_type(kl_type: str) -> tuple[str, bool]:
    if kl_type not in KL_TYPES:
        hint = " ('full' needs hidden states: npu_rl.kernels.full_vocab_kl)" if kl_type.startswith("full") else ""
        raise ValueError(f"unknown KL type {kl_type!r}{hint}; known: {', '.join(KL_TYPES)}")
    return kl_type.rstrip("+"), kl_type.endswith("+")
