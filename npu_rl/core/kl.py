"""KL estimators between the policy and the reference, the KL-in-reward and KL-loss helpers, and KL controllers.

Per-token estimators of KL(pi || pi_ref) from sampled tokens (J. Schulman, "Approximating KL divergence", 2020,
http://joschu.net/blog/kl-approx.html), with ``d = logp - logp_ref`` (config ``algorithm.kl_penalty`` for the KL in
the reward, default ``kl``; ``actor_rollout_ref.actor.kl_loss_type`` for the KL loss, default ``low_var_kl``)::

    kl  / k1          d
    abs               |d|
    mse / k2          d^2 / 2
    low_var_kl / k3   exp(-d) + d - 1,   with -d clamped to [-20, 20] and the result to [-10, 10] (verl's clamps)

A ``+`` suffix (``k1+``, ``k3+``, ``low_var_kl+`` ...) is a straight-through estimator: its value is the base
estimator's and its gradient is k2's (``k2 - sg[k2] + sg[base]``), since k2's gradient is the unbiased one for the
KL's gradient while k1 and k3 are unbiased only for its value. ``k2+`` / ``mse+`` equal k2.

``full`` (the exact KL over the whole vocabulary) is a valid name but is not computed here: it needs both models'
hidden states and is computed in the model forward (the fused log-prob kernel). :func:`kl_penalty` raises for it.

KL in the reward (``algorithm.use_kl_in_reward``): ``token_level_rewards = token_level_scores - beta * kl`` on valid
tokens, ``beta`` from a controller (``algorithm.kl_ctrl``): fixed (``kl_coef``, default 0.001), or adaptive
(Ziegler et al. 2019, arXiv:1909.08593): ``e = clip(kl / target_kl - 1, -0.2, 0.2)``,
``beta <- beta * (1 + e * n_steps / horizon)`` (defaults ``target_kl=0.1``, ``horizon=10000``), where ``kl`` is the
batch's mean of per-sequence mean KL and ``n_steps`` the batch size.

KL loss (``actor.use_kl_loss``, GRPO's choice): ``kl_loss_coef * agg(kl)`` added to the actor's loss
(``kl_loss_coef`` default 0.001), aggregated like the policy loss.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Protocol

import torch

from npu_rl.core.aggregation import Denominator, LossOutput, agg_loss, masked_mean
from npu_rl.core.checked_registry import CheckedRegistry

Number = float | torch.Tensor

KL_ESTIMATORS = CheckedRegistry(
    "KL estimator",
    "algorithm.kl_penalty / actor_rollout_ref.actor.kl_loss_type",
    expected="fn(*, logprobs: Tensor [B, T], ref_logprobs: Tensor [B, T]) -> Tensor [B, T]",
    probe_kwargs={"logprobs": None, "ref_logprobs": None},
)

FULL_KL = "full"  # computed in the model forward, not here
KL_CONTROLLER_TYPES: tuple[str, ...] = ("fixed", "adaptive")


@KL_ESTIMATORS.register("kl", "k1")
def kl_k1(*, logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("abs")
def kl_abs(*, logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return (logprobs - ref_logprobs).abs()


@KL_ESTIMATORS.register("mse", "k2")
def kl_k2(*, logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprobs - ref_logprobs).square()


@KL_ESTIMATORS.register("low_var_kl", "k3")
def kl_k3(*, logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    log_ratio = (ref_logprobs - logprobs).clamp(min=-20.0, max=20.0)  # log(pi_ref / pi)
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(min=-10.0, max=10.0)


def _known_kl_types() -> str:
    return f"{', '.join(KL_ESTIMATORS.names())} (each also with a '+' suffix), or {FULL_KL!r}"


def check_kl_type(name: str) -> None:
    """Fail now, listing the known names, unless ``name`` is a KL type :func:`kl_penalty` or the forward accepts."""
    if name == FULL_KL:
        return
    base = name.removesuffix("+")
    if base == FULL_KL:
        raise ValueError(f"KL type {name!r}: 'full' has no straight-through variant; known: {_known_kl_types()}")
    try:
        KL_ESTIMATORS.check(base)
    except ValueError:
        close = difflib.get_close_matches(base, KL_ESTIMATORS.names(), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"unknown KL type {name!r} (config keys algorithm.kl_penalty / actor_rollout_ref.actor.kl_loss_type)."
            f"{hint} Known: {_known_kl_types()}; or a plug-in path 'package.module:function' / 'path/to/file.py:function'"
        ) from None


def kl_penalty(*, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kl_type: str) -> torch.Tensor:
    """Per-token KL estimate [B, T] of type ``kl_type`` (see the module docstring)."""
    if kl_type == FULL_KL:
        raise NotImplementedError(
            "KL type 'full' (exact KL over the whole vocabulary) needs the hidden states / logits of both the policy "
            "and the reference and is computed in the model forward by the fused log-prob kernel, not from "
            "per-token log-probs in npu_rl.core"
        )
    straight_through = kl_type.endswith("+")
    base = kl_type[:-1] if straight_through else kl_type
    estimator: Callable[..., torch.Tensor] = KL_ESTIMATORS.get(base)
    value = estimator(logprobs=logprobs, ref_logprobs=ref_logprobs)
    if not straight_through or estimator is kl_k2:
        return value
    k2 = kl_k2(logprobs=logprobs, ref_logprobs=ref_logprobs)
    return k2 - k2.detach() + value.detach()


def kl_in_reward(
    *,
    token_level_scores: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: Number,
    kl_type: str = "kl",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``token_level_scores - kl_coef * kl`` [B, T] on valid tokens, and metrics.

    ``old_logprobs`` [B, T] are the rollout policy's (the actor before this step's update). Metrics:
    ``reward_kl_penalty`` (mean over sequences of each sequence's mean KL; feed it to the controller's ``update``)
    and ``reward_kl_penalty_coeff``.
    """
    kl = kl_penalty(logprobs=old_logprobs, ref_logprobs=ref_logprobs, kl_type=kl_type)
    kl = torch.where(response_mask.bool(), kl, torch.zeros_like(kl))  # [B, T]
    rewards = token_level_scores - kl_coef * kl
    current_kl = masked_mean(kl, response_mask, dim=-1).mean()  # [B] -> 0-d
    coeff = torch.as_tensor(kl_coef, dtype=kl.dtype, device=kl.device)
    return rewards, {"reward_kl_penalty": current_kl.detach(), "reward_kl_penalty_coeff": coeff.detach()}


def kl_loss(
    *,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_loss_coef: float,
    kl_type: str = "low_var_kl",
    loss_agg_mode: str = "token-mean",
    global_num_tokens: Denominator = None,
    global_num_seqs: Denominator = None,
    loss_scale_factor: Denominator = None,
    token_kl: torch.Tensor | None = None,
) -> LossOutput:
    """``kl_loss_coef * agg(kl)``, the term to add to the actor's loss. Metrics: ``kl_loss``, the mean KL over this
    micro-batch's valid tokens (without the coefficient). ``token_kl`` [B, T]: the per-token KL already computed
    (by a fused policy-loss implementation, the same estimator); None computes it here."""
    kl = token_kl if token_kl is not None else kl_penalty(logprobs=logprobs, ref_logprobs=ref_logprobs, kl_type=kl_type)
    aggregated = agg_loss(
        loss_mat=kl,
        loss_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        loss_scale_factor=loss_scale_factor,
    )
    return LossOutput(kl_loss_coef * aggregated, {"kl_loss": masked_mean(kl, response_mask).detach()})


# --------------------------------------------------------------------------------------------------- controllers


class KLController(Protocol):
    """``value`` is the current coefficient; ``update`` is called once per training step."""

    value: Number

    def update(self, *, current_kl: Number, n_steps: int) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class FixedKLController:
    """A constant ``value`` (``algorithm.kl_ctrl.kl_coef``)."""

    def __init__(self, *, kl_coef: float):
        self.value: Number = kl_coef

    def update(self, *, current_kl: Number, n_steps: int) -> None:
        """Nothing changes."""

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


class AdaptiveKLController:
    """Proportional control of the coefficient towards ``target_kl`` (Ziegler et al. 2019)."""

    def __init__(self, *, kl_coef: float, target_kl: float, horizon: int):
        if horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon must be > 0 for the adaptive controller, got {horizon}")
        if target_kl <= 0:
            raise ValueError(f"algorithm.kl_ctrl.target_kl must be > 0 for the adaptive controller, got {target_kl}")
        self.value: Number = kl_coef
        self.target_kl = target_kl
        self.horizon = horizon

    def update(self, *, current_kl: Number, n_steps: int) -> None:
        """``value *= 1 + clip(current_kl / target_kl - 1, -0.2, 0.2) * n_steps / horizon``."""
        error = current_kl / self.target_kl - 1.0
        if isinstance(error, torch.Tensor):
            error = error.clamp(min=-0.2, max=0.2)
        else:
            error = min(max(error, -0.2), 0.2)
        self.value = self.value * (1.0 + error * n_steps / self.horizon)

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


def make_kl_controller(*, type: str, kl_coef: float, target_kl: float = 0.1, horizon: int = 10000) -> KLController:
    """The controller ``algorithm.kl_ctrl`` names (``type``: fixed | adaptive)."""
    if type == "fixed":
        return FixedKLController(kl_coef=kl_coef)
    if type == "adaptive":
        return AdaptiveKLController(kl_coef=kl_coef, target_kl=target_kl, horizon=horizon)
    raise ValueError(f"unknown algorithm.kl_ctrl.type {type!r}; known: {', '.join(KL_CONTROLLER_TYPES)}")
