"""Policy losses: the registry ``POLICY_LOSSES`` (config key ``actor_rollout_ref.actor.policy_loss.loss_mode``).

Every loss has ONE signature, ``fn(inputs: PolicyLossInputs) -> LossOutput(loss, metrics)``; the actor calls
``compute_policy_loss(loss_mode=name, inputs=...)``. ``loss`` is this micro-batch's share of the global loss (see
:mod:`npu_rl.core.aggregation`: pass ``global_num_tokens`` AND ``global_num_seqs``, since the sequence-level losses
use the second whatever ``loss_agg_mode`` says). ``metrics`` always holds ``pg_clipfrac``, ``pg_clipfrac_lower`` and
``ppo_kl`` as detached 0-d tensors, means over this micro-batch's valid tokens (0 where a loss does not clip);
``ppo_kl = mean(old_logprobs - logprobs)``. Nothing here calls ``.item()``.

Notation: ``r = exp(logprobs - old_logprobs)`` per token (the log-ratio is clamped to [-20, 20] before ``exp`` in
vanilla, clip_cov, kl_cov and cispo; verl clamps only in vanilla and cispo; it is set to 0 on padding so that
garbage there cannot reach the gradient), ``A`` the advantage, ``eps_lo / eps_hi`` = ``clip_ratio_low / clip_ratio_high``
(``actor.clip_ratio_low/high``, default 0.2 each; DAPO's clip-higher uses 0.2 / 0.28). Losses are minimised.

- ``vanilla``: PPO clip (Schulman et al. 2017, arXiv:1707.06347) with asymmetric bounds and dual clip
  (Ye et al. 2019, arXiv:1912.09729): ``l1 = max(-A r, -A clip(r, 1 - eps_lo, 1 + eps_hi))``; for ``A < 0`` the
  loss is ``min(l1, -A c)`` with ``c = clip_ratio_c`` (default 3.0, must be > 1). ``pg_clipfrac`` counts tokens
  where the clipped term won, ``pg_clipfrac_lower`` those where the dual clip did.
- ``gspo``: sequence-level ratio ``s_i = exp(mean_t log r_{i,t})`` (GSPO, arXiv:2507.18071), applied per token as
  ``sg[s_i] * pi / sg[pi]`` so every token gets the sequence ratio's value and its own gradient; log-ratio clamped
  above at 10; PPO clip on ``s_i``. Aggregated with ``loss_agg_mode`` like every other loss. The paper's objective
  (a mean over sequences of the token mean) is ``loss_agg_mode=seq-mean-token-mean``, which verl's GSPO examples
  set; verl's code at 1dda039 forces that mode inside the loss (see docs/algorithms.md).
- ``clip_cov``: PPO clip, plus the gradient of a random ``clip_cov_ratio`` fraction of the tokens whose centered
  covariance ``(A - mean A)(logp - mean logp)`` lies in ``(clip_cov_lb, clip_cov_ub)`` (and not already clipped) is
  cut ("The Entropy Mechanism of RL for Reasoning LMs", arXiv:2505.22617). ``pg_clipfrac`` is the
  fraction cut. Uses torch's global RNG. Statistics are over this micro-batch, as in verl. The token budget is
  ``max(int(ratio * N), 1)`` for ``N`` valid tokens, computed in float64 as verl's Python float does
  (``3e-4 * 10000`` is 2.9999999999999996 there, so 2 tokens; float32 would give 3).
- ``kl_cov``: ``-A r``, plus ``ppo_kl_coef * |log r|`` on the ``kl_cov_ratio`` fraction of tokens with the largest
  covariance (same paper). No ratio clip. Statistics over this micro-batch; same float64 token budget.
- ``gpg``: ``-A logp`` (Group Policy Gradient, arXiv:2504.02546): plain policy gradient, no ratio.
- ``geo_mean``: GMPO (arXiv:2507.20673): per token the log-ratio is clipped to ``[-eps_lo, eps_hi]`` in the
  direction of ``sign(A)``; the sequence ratio is the geometric mean ``exp(mean_t clipped log r)``, the sequence
  advantage ``mean_t A``; loss ``-A_seq r_seq`` averaged over sequences (``loss_agg_mode`` does not apply).
- ``sapo``: soft-gated policy optimisation (arXiv:2511.20347): ``-f(r) A`` with the gate
  ``f(r) = sigmoid(tau (r - 1)) * 4 / tau``, ``tau = tau_pos`` where ``A > 0`` else ``tau_neg`` (``actor.tau_pos`` 1.0,
  ``actor.tau_neg`` 1.05). No hard clip: the gradient ``A r sigmoid' * 4`` fades smoothly off-policy. Always
  aggregated as ``seq-mean-token-mean`` (as verl does).
- ``dro``: Direct Reward Optimisation: ``-(A logp - beta / 2 (log r)^2)`` with ``beta = policy_loss.dro_beta`` (> 0,
  required). Log-ratio not clamped (as verl).
- ``dppo_tv`` / ``dppo_kl``: DPPO-Binary (arXiv:2602.04879): ``-A sg[min(r, c)] logp`` on the tokens where the
  divergence between the new and old probability of the sampled token stays within the trust region, 0 elsewhere.
  Here ``eps_lo / eps_hi`` are divergence thresholds, not ratio bounds: ``dppo_tv`` keeps a token with ``A > 0``
  when ``p - p_old <= eps_hi`` and one with ``A <= 0`` when ``p - p_old >= -eps_lo``; ``dppo_kl`` uses the binary KL
  ``p_old log(p_old / p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8))`` and keeps a token with ``A > 0``
  when it is ``<= eps_hi`` or ``p <= p_old`` (``<= eps_lo`` or ``p >= p_old`` for ``A <= 0``). ``c = clip_ratio_c``
  truncates the importance weight (TIS). ``pg_clipfrac`` is the fraction outside the region, ``pg_clipfrac_lower``
  the fraction inside it whose ratio was truncated. Like cispo, only the gradient is meaningful.
- ``cispo``: ``-sg[clip(r, 1 - eps_lo, 1 + eps_hi)] A logp`` (MiniMax-M1, arXiv:2506.13585): the clipped ratio
  only weights the gradient, every token keeps a gradient. Its value is not a PPO objective; only the gradient is.

- ``bypass_mode``: verl's bypass mode (``algorithm.rollout_correction.bypass_mode=true``): ``old_logprobs`` ARE the
  rollout engine's log-probs (the old-log-prob forward is skipped). Weights and rejections are computed here from
  the current ``logprobs`` against them (``inputs.rollout_correction``; per micro-batch, detached); rejected tokens
  leave the mask (they still count in the global denominators, as in verl). ``loss_type=ppo_clip``: vanilla PPO
  with ``r = pi / pi_rollout`` and no extra weight (the ratio is the correction); ``reinforce``:
  ``-sg[w] A logp`` with the truncated / masked weights ``w`` (``-A logp`` without ``rollout_is``). Metrics add the
  ``rollout_corr/*`` of :mod:`npu_rl.core.rollout_correction`; in the reinforce case ``ppo_kl`` is
  ``mean(rollout - logp)`` and the clip fractions are 0.

``rollout_is_weights`` [B, T] (optional) multiplies the per-token loss (truncated importance sampling between the
rollout engine and the trainer); ``geo_mean`` uses their geometric mean per sequence.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, replace

import torch

from npu_rl.core.aggregation import Denominator, LossOutput, agg_loss, masked_mean
from npu_rl.core.checked_registry import CheckedRegistry, describe_callable
from npu_rl.core.rollout_correction import RolloutCorrectionSpec, rollout_correction


@dataclass(frozen=True, eq=False)
class PolicyLossInputs:
    """Everything any policy loss may read; each uses what it needs. The settings are the config's values, passed
    by the caller (keyword-only, no defaults: the schema is the one home of a config key's default)."""

    old_logprobs: torch.Tensor  # [B, T] behaviour policy (no grad)
    logprobs: torch.Tensor  # [B, T] current policy (requires grad)
    advantages: torch.Tensor  # [B, T]
    response_mask: torch.Tensor  # [B, T]
    _: KW_ONLY
    loss_agg_mode: str  # actor.loss_agg_mode
    loss_scale_factor: Denominator  # seq-mean-token-sum-norm divisor (actor.loss_scale_factor; None: T)
    clip_ratio_low: float  # actor.clip_ratio_low (resolved: resolved_clip_ratios)
    clip_ratio_high: float  # actor.clip_ratio_high (resolved)
    clip_ratio_c: float  # actor.clip_ratio_c (dual clip, > 1)
    clip_cov_ratio: float  # actor.policy_loss.clip_cov_ratio
    clip_cov_lb: float  # actor.policy_loss.clip_cov_lb
    clip_cov_ub: float  # actor.policy_loss.clip_cov_ub
    kl_cov_ratio: float  # actor.policy_loss.kl_cov_ratio
    ppo_kl_coef: float  # actor.policy_loss.ppo_kl_coef
    tau_pos: float  # actor.tau_pos (sapo gate temperature where A > 0)
    tau_neg: float  # actor.tau_neg (sapo gate temperature where A <= 0)
    dro_beta: float | None  # actor.policy_loss.dro_beta (dro; required there, > 0)
    # For implementations that compute the KL loss's per-token values in the same pass (a fused kernel): the
    # estimator (actor.kl_loss_type) and the reference's log-probs [B, T] (below). Plain implementations ignore them.
    kl_loss_type: str
    global_num_tokens: Denominator = None  # valid tokens in the whole mini-batch (all micro-batches and ranks)
    global_num_seqs: Denominator = None  # sequences with a valid token in the whole mini-batch
    rollout_is_weights: torch.Tensor | None = None  # [B, T] importance weights, no grad
    ref_logprobs: torch.Tensor | None = None
    rollout_correction: RolloutCorrectionSpec | None = None  # bypass_mode's settings (algorithm.rollout_correction)

    def aggregate(self, loss_mat: torch.Tensor, loss_agg_mode: str | None = None) -> torch.Tensor:
        """``agg_loss`` of ``loss_mat`` [B, T] with this batch's mask and denominators."""
        return agg_loss(
            loss_mat=loss_mat,
            loss_mask=self.response_mask,
            loss_agg_mode=loss_agg_mode or self.loss_agg_mode,
            global_num_tokens=self.global_num_tokens,
            global_num_seqs=self.global_num_seqs,
            loss_scale_factor=self.loss_scale_factor,
        )


POLICY_LOSSES = CheckedRegistry(
    "policy loss",
    "actor_rollout_ref.actor.policy_loss.loss_mode",
    expected="fn(inputs: PolicyLossInputs) -> LossOutput(loss, metrics)",
    probe_args=(None,),
)


def compute_policy_loss(*, loss_mode: str, inputs: PolicyLossInputs, implementation: str | None = None) -> LossOutput:
    """Run the loss named ``loss_mode`` (a registered name or a plug-in path) and check its output.

    ``implementation`` (e.g. ``"fused"``) picks another registered implementation of the same loss where one exists
    (:meth:`~npu_rl.utils.registry.Registry.register_implementation`), else the plain one."""
    fn = POLICY_LOSSES.get(loss_mode, implementation)
    result = fn(inputs)
    ok = isinstance(result, tuple) and len(result) in (2, 3)
    ok = ok and isinstance(result[0], torch.Tensor) and result[0].dim() == 0 and isinstance(result[1], dict)
    if not ok:
        raise TypeError(
            f"policy loss {loss_mode!r} ({describe_callable(fn)}) returned {type(result).__name__}; expected "
            "LossOutput(loss: 0-d tensor, metrics: dict of tensors)"
        )
    return LossOutput(*result)


def resolved_clip_ratios(clip_ratio: float, clip_ratio_low: float | None, clip_ratio_high: float | None
                         ) -> tuple[float, float]:
    """``(low, high)``: ``actor.clip_ratio_low/high``, each falling back to ``actor.clip_ratio`` when unset."""
    return (clip_ratio if clip_ratio_low is None else clip_ratio_low,
            clip_ratio if clip_ratio_high is None else clip_ratio_high)


# ------------------------------------------------------------------------------------------------------- helpers


def _log_ratio(inputs: PolicyLossInputs) -> torch.Tensor:
    """``logprobs - old_logprobs`` [B, T], clamped to [-20, 20] so ``exp`` cannot overflow, and 0 on padding (so
    whatever padding holds cannot reach the gradient through the ratio)."""
    log_ratio = (inputs.logprobs - inputs.old_logprobs).clamp(min=-20.0, max=20.0)
    return torch.where(inputs.response_mask.bool(), log_ratio, torch.zeros_like(log_ratio))


def _metrics(
    inputs: PolicyLossInputs,
    log_ratio: torch.Tensor,
    clipfrac: torch.Tensor | None = None,
    clipfrac_lower: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    mask = inputs.response_mask
    zero = torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device)
    return {
        "pg_clipfrac": (zero if clipfrac is None else clipfrac).detach(),
        "pg_clipfrac_lower": (zero if clipfrac_lower is None else clipfrac_lower).detach(),
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
    }


def _weighted(inputs: PolicyLossInputs, losses: torch.Tensor) -> torch.Tensor:
    return losses if inputs.rollout_is_weights is None else losses * inputs.rollout_is_weights


def _clipped_surrogate(inputs: PolicyLossInputs, ratio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``max(-A r, -A clip(r))`` [B, T] and the float mask of tokens where the clipped term won."""
    advantages = inputs.advantages
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - inputs.clip_ratio_low, 1.0 + inputs.clip_ratio_high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).to(ratio.dtype)


def _centered_covariance(inputs: PolicyLossInputs) -> torch.Tensor:
    """``(A - mean A)(logp - mean logp)`` [B, T] over valid tokens, detached (it only selects tokens)."""
    mask = inputs.response_mask
    advantages, logprobs = inputs.advantages.detach(), inputs.logprobs.detach()
    return (advantages - masked_mean(advantages, mask)) * (logprobs - masked_mean(logprobs, mask))


def token_budget(ratio: float, num_valid: torch.Tensor) -> torch.Tensor:
    """``max(floor(ratio * N), 1)`` as a 0-d float64 tensor on ``num_valid``'s device, no host sync.

    float64 because verl computes ``int(ratio * N)`` with Python floats: in float32 ``3e-4 * 10000`` rounds up to
    3.0000001 (floor 3) where float64 gives 2.9999999999999996 (floor 2).
    """
    return (num_valid.to(torch.float64) * ratio).floor().clamp(min=1)


def _top_fraction(keys: torch.Tensor, eligible: torch.Tensor, num_selected: torch.Tensor) -> torch.Tensor:
    """Bool mask [B, T]: the ``num_selected`` (0-d tensor) eligible entries with the largest ``keys``.

    Ranks by sorting, so the count stays on the device (no ``.item()``).
    """
    flat = torch.where(eligible, keys, torch.full_like(keys, float("-inf"))).reshape(-1)
    order = torch.argsort(flat, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    return eligible & (rank.reshape(keys.shape) < num_selected)


# -------------------------------------------------------------------------------------------------------- losses


@POLICY_LOSSES.register("vanilla")
def vanilla_policy_loss(inputs: PolicyLossInputs) -> LossOutput:
    """Dual-clip PPO with asymmetric clip ratios."""
    if not inputs.clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip PPO lower bound) must be > 1, got {inputs.clip_ratio_c}")
    mask, advantages = inputs.response_mask, inputs.advantages
    log_ratio = _log_ratio(inputs)
    ratio = torch.exp(log_ratio)  # [B, T]
    clipped_loss, clipped = _clipped_surrogate(inputs, ratio)
    dual_bound = -advantages * inputs.clip_ratio_c  # [B, T]
    negative = advantages < 0
    dual_clipped = (negative & (clipped_loss > dual_bound)).to(ratio.dtype)
    losses = torch.where(negative, torch.minimum(clipped_loss, dual_bound), clipped_loss)
    loss = inputs.aggregate(_weighted(inputs, losses))
    return LossOutput(loss, _metrics(inputs, log_ratio, masked_mean(clipped, mask), masked_mean(dual_clipped, mask)))


@POLICY_LOSSES.register("gspo")
def gspo_policy_loss(inputs: PolicyLossInputs) -> LossOutput:
    """Sequence-level ratio with per-token gradient, aggregated with ``loss_agg_mode``."""
    mask = inputs.response_mask
    log_ratio = inputs.logprobs - inputs.old_logprobs  # [B, T]
    lengths = mask.to(log_ratio.dtype).sum(dim=-1).clamp(min=1)  # [B]
    seq_log_ratio = (torch.where(mask.bool(), log_ratio, torch.zeros_like(log_ratio)).sum(dim=-1) / lengths).detach()
    token_log_ratio = inputs.logprobs - inputs.logprobs.detach() + seq_log_ratio.unsqueeze(-1)  # [B, T]
    ratio = torch.exp(token_log_ratio.clamp(max=10.0))
    losses, clipped = _clipped_surrogate(inputs, ratio)
    loss = inputs.aggregate(_weighted(inputs, losses))
    return LossOutput(loss, _metrics(inputs, log_ratio, masked_mean(clipped, mask)))


@POLICY_LOSSES.register("clip_cov")
def clip_cov_policy_loss(inputs: PolicyLossInputs) -> LossOutput:
    """PPO clip, and the gradient cut on a random few tokens of high covariance."""
    mask = inputs.response_mask
    valid = mask.bool()
    log_ratio = _log_ratio(inputs)
    losses, clipped = _clipped_surrogate(inputs, torch.exp(log_ratio))
    covariance = _centered_covariance(inputs)
    eligible = valid & (clipped == 0) & (covariance > inputs.clip_cov_lb) & (covariance < inputs.clip_cov_ub)
    num_cut = token_budget(inputs.clip_cov_ratio, valid.sum())  # 0-d, stays on the device
    random_keys = torch.rand(covariance.shape, device=covariance.device)
    cut = _top_fraction(random_keys, eligible, num_cut)
    losses = torch.where(cut, torch.zeros_like(losses), losses)
    loss = inputs.aggregate(_weighted(inputs, losses))
    return LossOutput(loss, _metrics(inputs, log_ratio, masked_mean(cut.to(losses.dtype), mask)))


@POLICY_LOSSES.register("kl_cov")
def kl_cov_policy_loss(inputs: PolicyLossInputs) -> LossOutput:
    """``-A r``, plus ``ppo_kl_coef |log r|`` on the tokens of largest covariance."""
    valid = inputs.response_mask.bool()
    log_ratio = _log_ratio(inputs)
    losses = -inputs.advantages * torch.exp(log_ratio)
    num_penalised = token_budget(inputs.kl_cov_ratio, valid.sum())
    penalised = _top_fraction(_centered_covariance(inputs), valid, num_penalised)
    losses = torch.where(penalised, losses + inputs.ppo_kl_coef * log_ratio.abs(), losses)
    loss = inputs.aggregate(_weighted(inputs, losses))
    return LossOutput(loss, _metrics(inputs, log_ratio))


@POLICY_LOSSES.register("gpg")
def gpg_policy_loss(inputs: PolicyLossInputs) -> LossOutput:
    """Plain policy gradient ``-A logp``."""
    losses = -inputs.advantages * inputs.logprobs
    loss = inputs.aggregate(_weighted(inputs, losses))
    return LossOutput(loss, _metrics(inputs, _log_ratio(inputs)))


@POLICY_LOSSES.register("geo_mean")
def geo_mean_policy_loss(inputs: PolicyLossInputs) -> LossOutput:
    """GMPO: geometric mean of token ratios clipped in log space; a mean over sequences."""
    mask = inputs.response_mask
    valid = mask.bool()
    advantages = inputs.advantages
    log_ratio = inputs.logprobs - inputs.old_logprobs  # [B, T]
    sign = torch.sign(advantages)
    clamped = log_ratio.clamp(min=-inputs.clip_ratio_low, max=inputs.clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)  # [B, T]
    seq_ratio = torch.exp(_seq_token_mean(pessimistic, valid))  # [B]
    seq_advantage = _seq_token_mean(advantages, valid)  # [B]
    seq_losses = -seq_advantage * seq_ratio  # [B]
    if inputs.rollout_is_weights is not None:
        seq_losses = seq_losses * torch.exp(_seq_token_mean(torch.log(inputs.rollout_is_weights + 1e-10), valid))
    per_token = seq_losses.unsqueeze(-1).expand_as(log_ratio)  # a token-mean of a constant row is the row's value
    loss = inputs.aggregate(per_token, loss_agg_mode="seq-mean-token-mean")
    is_clipped = (log_ratio != clamped).to(log_ratio.dtype)
    clipfrac = masked_mean(is_clipped * (advantages > 0), mask)
    clipfrac_lower = masked_mean(is_clipped * (advantages < 0), mask)
    return LossOutput(loss, _metrics(inputs, log_ratio, clipfrac, clipfrac_lower))


def _seq_token_mean(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean over each row's valid tokens [B, T] -> [B]; empty rows give 0."""
    total = torch.where(valid, values, torch.zeros_like(values)).sum(dim=-1)
    return total / valid.to(values.dtype).sum(dim=-1).clamp(min=1)


@POLICY_LOSSES.register("cispo")
def cispo_policy_loss(inputs: PolicyLossInputs) -> LossOutput:
    """``-sg[clip(r)] A logp``: clipped importance weight, gradient through ``logp`` only."""
    mask = inputs.response_mask
    log_ratio = _log_ratio(inputs)
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(1.0 - inputs.clip_ratio_low, 1.0 + inputs.clip_ratio_high).detach()
    losses = -weight * inputs.advantages * inputs.logprobs
    clipfrac = masked_mean((ratio.detach() != weight).to(ratio.dtype), mask)
    loss = inputs.aggregate(_weighted(inputs, losses))
    return LossOutput(loss, _metrics(inputs, log_ratio, clipfrac))


@POLICY_LOSSES.register("sapo")
def sapo_policy_loss(inputs: PolicyLossInputs) -> LossOutput:
    """``-f(r) A`` with the soft gate ``f(r) = sigmoid(tau (r - 1)) 4 / tau``; always ``seq-mean-token-mean``."""
    advantages = inputs.advantages
    log_ratio = _log_ratio(inputs)
    ratio = torch.exp(log_ratio)
    tau = torch.where(
        advantages > 0,
        torch.full_like(advantages, inputs.tau_pos),
        torch.full_like(advantages, inputs.tau_neg),
    )
    gates = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    losses = -gates * advantages
    loss = inputs.aggregate(_weighted(inputs, losses), loss_agg_mode="seq-mean-token-mean")
    return LossOutput(loss, _metrics(inputs, log_ratio))


@POLICY_LOSSES.register("dro")
def dro_policy_loss(inputs: PolicyLossInputs) -> LossOutput:
    """``-(A logp - beta / 2 (log r)^2)``: policy gradient with a quadratic penalty on the log-ratio."""
    beta = inputs.dro_beta
    if beta is None or not beta > 0:
        raise ValueError(f"policy loss 'dro' needs actor.policy_loss.dro_beta > 0, got {beta}")
    valid = inputs.response_mask.bool()
    log_ratio = inputs.logprobs - inputs.old_logprobs
    log_ratio = torch.where(valid, log_ratio, torch.zeros_like(log_ratio))
    losses = -(inputs.advantages * inputs.logprobs - 0.5 * beta * log_ratio.square())
    loss = inputs.aggregate(_weighted(inputs, losses))
    return LossOutput(loss, _metrics(inputs, log_ratio))


def _dppo(inputs: PolicyLossInputs, keep_positive: torch.Tensor, keep_negative: torch.Tensor) -> LossOutput:
    """``-A sg[min(r, c)] logp`` on the tokens kept by the trust-region masks (one per sign of ``A``)."""
    mask = inputs.response_mask
    advantages = inputs.advantages
    log_ratio = _log_ratio(inputs)
    ratio = torch.exp(log_ratio)
    truncated = ratio.clamp(max=inputs.clip_ratio_c).detach()
    kept = torch.where(advantages > 0, keep_positive, keep_negative).to(ratio.dtype).detach()
    losses = -advantages * truncated * inputs.logprobs * kept
    loss = inputs.aggregate(_weighted(inputs, losses))
    clipfrac = masked_mean(1.0 - kept, mask)
    clipfrac_lower = masked_mean((ratio > inputs.clip_ratio_c).to(ratio.dtype) * kept, mask)
    return LossOutput(loss, _metrics(inputs, log_ratio, clipfrac, clipfrac_lower))


@POLICY_LOSSES.register("dppo_tv")
def dppo_tv_policy_loss(inputs: PolicyLossInputs) -> LossOutput:
    """DPPO-Binary-TV: trust region on ``p - p_old`` of the sampled token."""
    prob, old_prob = torch.exp(inputs.logprobs.detach()), torch.exp(inputs.old_logprobs)
    change = prob - old_prob
    return _dppo(inputs, change <= inputs.clip_ratio_high, change >= -inputs.clip_ratio_low)


@POLICY_LOSSES.register("dppo_kl")
def dppo_kl_policy_loss(inputs: PolicyLossInputs) -> LossOutput:
    """DPPO-Binary-KL: trust region on the KL between the Bernoulli(p_old) and Bernoulli(p) of the sampled token."""
    logprobs, old_logprobs = inputs.logprobs.detach(), inputs.old_logprobs
    prob, old_prob = torch.exp(logprobs), torch.exp(old_logprobs)
    binary_kl = old_prob * (old_logprobs - logprobs) + (1.0 - old_prob) * torch.log(
        (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
    )
    keep_positive = (binary_kl <= inputs.clip_ratio_high) | (prob <= old_prob)
    keep_negative = (binary_kl <= inputs.clip_ratio_low) | (prob >= old_prob)
    return _dppo(inputs, keep_positive, keep_negative)


@POLICY_LOSSES.register("bypass_mode")
def bypass_mode_policy_loss(inputs: PolicyLossInputs) -> LossOutput:
    """verl's bypass mode: ``old_logprobs`` are the rollout's; PPO clip or IS-weighted REINFORCE against them."""
    spec = inputs.rollout_correction
    if spec is None:
        raise ValueError("policy loss 'bypass_mode' needs inputs.rollout_correction (algorithm.rollout_correction)")
    with torch.no_grad():
        correction = rollout_correction(inputs.logprobs, inputs.old_logprobs, inputs.response_mask, spec)
    inner = replace(inputs, response_mask=correction.response_mask, rollout_is_weights=None)
    if spec.loss_type == "ppo_clip":
        loss, metrics = vanilla_policy_loss(inner)[:2]
    else:
        weights = correction.weights
        losses = -inputs.advantages * inputs.logprobs * (1.0 if weights is None else weights)
        loss, metrics = inner.aggregate(losses), _metrics(inner, _log_ratio(inner))
    metrics = dict(metrics) | {f"rollout_corr/{k}": v.detach() for k, v in correction.metrics.items()}
    return LossOutput(loss, metrics)
