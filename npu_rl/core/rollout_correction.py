"""Rollout correction: the rollout engine and the trainer disagree on the probabilities of the same tokens.

verl's ``algorithm.rollout_correction`` (docs/algorithms.md has the keys and the math). With
``log r = old_logprobs - rollout_logprobs`` per token (``pi_train / pi_rollout``; the log-ratio is clamped to
[-20, 20] before any ``exp``, as in verl, except in the ``k3_kl`` metric, which verl computes unclamped):

- importance weights (``rollout_is``): ``token``: ``w_t = exp(log r_t)``; ``sequence``: ``w = exp(sum_t log r_t)`` for
  every token of the row. ``rollout_is_threshold``: a number ``U`` truncates (TIS: ``min(w, U)``); a string
  ``"L_U"`` masks (MIS / IcePop: ``w`` outside ``[L, U]`` becomes 0). ``rollout_is_batch_normalize`` divides by the
  batch mean of the weights (tokens, or one weight per sequence). Weights are 0 on padding and carry no gradient.
- rejection (``rollout_rs``, comma-separated options, all must pass): per token ``k1 = -log r``,
  ``k2 = (log r)^2 / 2``, ``k3 = exp(log r) - 1 - log r``; ``token_kN`` tests each token, ``seq_sum_kN`` the row's
  sum, ``seq_mean_kN`` its mean (``seq_mean_k1`` is the geometric mean of the ratios), ``seq_max_kN`` its maximum.
  ``k1`` options keep ``log L <= statistic <= log U`` (threshold ``"L_U"``, or ``U`` alone meaning ``L = 1/U``);
  ``k2`` / ``k3`` options keep ``statistic <= U``. A sequence option rejects every token of the row. Rejected tokens
  leave the response mask.
- metrics (verl's names, logged under ``rollout_corr/``): see :func:`offpolicy_metrics`, :func:`is_metrics`,
  :func:`rejection_metrics`.

Everything here is a pure tensor function: no config objects, no ``.item()``, no collectives. The trainer calls
:func:`rollout_correction` once on the whole batch (so the batch normalisation is global); the ``bypass_mode`` policy
loss calls it per micro-batch, where every option except the batch normalisation is independent of the split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from npu_rl.core.aggregation import masked_mean, masked_sum

SAFETY_BOUND = 20.0
IS_LEVELS = ("token", "sequence")
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
LOSS_TYPES = ("ppo_clip", "reinforce")
# verl's earlier names for the same rejections (its 2025 API), for a helpful error message.
LEGACY_RS = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}


# ------------------------------------------------------------------------------------------------ the settings


def parse_is_threshold(spec: float | str) -> tuple[float, float | None]:
    """``rollout_is_threshold`` -> (upper, lower or None). A number (or numeric string) is a TIS cap; ``"L_U"``
    gives MIS bounds. Raises ValueError naming the key."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        message = f"rollout_is_threshold={spec!r}: expected a number (TIS cap) or a 'lower_upper' string"
        raise ValueError(message)  # noqa: TRY004 (a bad config value: ValueError, like every other check here)
    text = str(spec).strip()
    try:
        lower, upper = (float(x) for x in text.split("_", 1)) if "_" in text else (None, float(text))
    except ValueError:
        raise ValueError(f"rollout_is_threshold={spec!r}: expected a number or 'lower_upper', e.g. 2.0 or "
                         "'0.5_2.0'") from None
    if not 0 < upper < math.inf or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"rollout_is_threshold={spec!r}: bounds must be positive and finite with lower <= upper")
    return upper, lower


def parse_rs_options(spec: str) -> tuple[str, ...]:
    """``rollout_rs`` -> the options in order, duplicates dropped. Raises ValueError naming the key."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"rollout_rs={spec!r}: expected comma-separated options from {', '.join(RS_OPTIONS)}")
    options: list[str] = []
    for raw in spec.split(","):
        name = raw.strip()
        if name in LEGACY_RS:
            raise ValueError(f"rollout_rs={spec!r}: {name!r} is verl's old name; use {LEGACY_RS[name]!r}")
        if name not in RS_OPTIONS:
            raise ValueError(f"rollout_rs={spec!r}: unknown option {name!r}; known: {', '.join(RS_OPTIONS)}")
        if name not in options:
            options.append(name)
    return tuple(options)


def parse_rs_thresholds(options: tuple[str, ...], spec: float | str | None) -> dict[str, tuple[float | None, float]]:
    """``rollout_rs_threshold`` -> {option: (lower or None, upper)}: one value for all options or one per option
    (comma-separated). ``k1`` options take ``"L_U"`` or ``U`` (then ``L = 1/U``), the others a single ``U``."""
    if spec is None or isinstance(spec, bool):
        raise ValueError(f"rollout_rs_threshold={spec!r}: rejection (rollout_rs) needs a threshold")
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    if len(parts) not in (1, len(options)):
        raise ValueError(f"rollout_rs_threshold={spec!r}: give one threshold, or one per rollout_rs option "
                         f"({len(options)})")
    parts = parts * len(options) if len(parts) == 1 else parts
    out: dict[str, tuple[float | None, float]] = {}
    for option, part in zip(options, parts):
        k1 = option.endswith("k1")
        if "_" in part and not k1:
            raise ValueError(f"rollout_rs_threshold={spec!r}: {option} takes a single upper bound, not {part!r}")
        try:
            lower, upper = (float(x) for x in part.split("_", 1)) if "_" in part else (None, float(part))
        except ValueError:
            raise ValueError(f"rollout_rs_threshold={spec!r}: {part!r} is not a number") from None
        if k1 and lower is None and upper > 0:
            lower = 1.0 / upper
        if not 0 < upper < math.inf or (lower is not None and not 0 < lower <= upper):
            raise ValueError(f"rollout_rs_threshold={spec!r}: bounds for {option} must be positive and finite, "
                             "lower <= upper")
        out[option] = (lower, upper)
    return out


@dataclass(frozen=True)
class RolloutCorrectionSpec:
    """The settings, as plain values (verl's key names); checked when built (ValueError naming the key)."""

    rollout_is: str | None = None  # None | token | sequence
    rollout_is_threshold: float | str | None = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None  # None | comma-separated RS_OPTIONS
    rollout_rs_threshold: float | str | None = None
    loss_type: str = "ppo_clip"  # bypass mode's loss: ppo_clip | reinforce

    def __post_init__(self) -> None:
        if self.rollout_is is not None:
            if self.rollout_is not in IS_LEVELS:
                raise ValueError(f"rollout_is={self.rollout_is!r}: expected null, 'token' or 'sequence'")
            if self.rollout_is_threshold is None:
                raise ValueError("rollout_is_threshold=null: importance weights (rollout_is) need a threshold")
            parse_is_threshold(self.rollout_is_threshold)
        if self.rollout_rs is not None:
            parse_rs_thresholds(parse_rs_options(self.rollout_rs), self.rollout_rs_threshold)
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type={self.loss_type!r}: expected one of {', '.join(LOSS_TYPES)}")

    @property
    def enabled(self) -> bool:
        return self.rollout_is is not None or self.rollout_rs is not None


class CorrectionOutput(NamedTuple):
    weights: torch.Tensor | None  # [B, T] rollout_is_weights (None without rollout_is), detached
    response_mask: torch.Tensor  # [B, T] the mask with rejected tokens removed
    metrics: dict[str, torch.Tensor]  # verl's names without the ``rollout_corr/`` prefix; 0-d tensors


# -------------------------------------------------------------------------------------------------- the pieces


def _valid_rows(mask: torch.Tensor) -> torch.Tensor:
    return mask.bool().any(dim=-1)


def _row_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_sum(values, mask, dim=-1)


def _rows_mean(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` [B] over the rows where ``rows`` [B] is True; 0 when none."""
    return masked_mean(values, rows)


def _masked_extreme(values: torch.Tensor, valid: torch.Tensor, largest: bool) -> torch.Tensor:
    fill = float("-inf") if largest else float("inf")
    filled = torch.where(valid.bool(), values, torch.full_like(values, fill))
    out = filled.max() if largest else filled.min()
    return torch.where(valid.bool().any(), out, torch.zeros_like(out))


def importance_weights(log_ratio: torch.Tensor, response_mask: torch.Tensor, level: str, upper: float,
                       lower: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(applied weights, raw weights) [B, T], both 0 on padding and detached. ``lower`` None: truncate at
    ``upper`` (TIS); else zero outside ``[lower, upper]`` (MIS)."""
    mask = response_mask.to(log_ratio.dtype)
    log_ratio = log_ratio.detach()
    if level == "token":
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    elif level == "sequence":
        seq = _row_sum(log_ratio, response_mask).clamp(-SAFETY_BOUND, SAFETY_BOUND)
        raw = torch.exp(seq).unsqueeze(-1).expand_as(log_ratio)
    else:
        raise ValueError(f"rollout_is={level!r}: expected 'token' or 'sequence'")
    raw = raw * mask
    if lower is None:
        return raw.clamp(max=upper), raw
    inside = (raw >= lower) & (raw <= upper)
    return torch.where(inside, raw, torch.zeros_like(raw)), raw


def batch_normalize(weights: torch.Tensor, response_mask: torch.Tensor, level: str) -> tuple[torch.Tensor,
                                                                                              torch.Tensor]:
    """Divide by the batch mean (over tokens; over sequences for ``sequence``); (weights, the mean used).
    A mean below 1e-8 leaves the weights as they are (factor 1)."""
    if level == "token":
        mean = masked_mean(weights, response_mask)
    else:
        mean = _rows_mean(masked_mean(weights, response_mask, dim=-1), _valid_rows(response_mask))
    factor = torch.where(mean > 1e-8, mean, torch.ones_like(mean))
    return weights / factor, factor


def _rs_statistic(option: str, log_ratio: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The statistic an option tests: [B, T] for token options, [B] for sequence options."""
    lr = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    per_token = {"k1": -lr, "k2": 0.5 * lr.square(), "k3": torch.exp(lr) - 1.0 - lr}[option[-2:]]
    if option.startswith("token_"):
        return per_token
    if option.startswith("seq_sum_"):
        return _row_sum(per_token, response_mask)
    if option.startswith("seq_mean_"):
        return masked_mean(per_token, response_mask, dim=-1)
    return _masked_extreme_rows(per_token, response_mask)


def _masked_extreme_rows(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    filled = torch.where(mask.bool(), values, torch.full_like(values, float("-inf")))
    out = filled.max(dim=-1).values
    return torch.where(torch.isfinite(out), out, torch.zeros_like(out))


def _keep(option: str, statistic: torch.Tensor, lower: float | None, upper: float) -> torch.Tensor:
    if option.endswith("k1"):
        return (statistic >= math.log(lower)) & (statistic <= math.log(upper))
    return statistic <= upper


def rejection_mask(log_ratio: torch.Tensor, response_mask: torch.Tensor,
                   thresholds: dict[str, tuple[float | None, float]]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(the response mask with every option's rejections removed, metrics). ``thresholds`` as returned by
    :func:`parse_rs_thresholds`."""
    log_ratio = log_ratio.detach()
    valid = response_mask.bool()
    rows = _valid_rows(response_mask)
    keep_all = torch.ones_like(valid)
    metrics: dict[str, torch.Tensor] = {}
    for option, (lower, upper) in thresholds.items():
        statistic = _rs_statistic(option, log_ratio, response_mask)
        keep = _keep(option, statistic, lower, upper)
        keep_tokens = keep if keep.dim() == 2 else keep.unsqueeze(-1).expand_as(valid)
        keep_all = keep_all & keep_tokens
        metrics |= rejection_metrics(option, statistic, keep_tokens, response_mask, lower, upper)
    dropped = (~keep_all & valid).to(log_ratio.dtype)
    metrics["rollout_rs_masked_fraction"] = masked_mean(dropped, response_mask)
    metrics["rollout_rs_seq_masked_fraction"] = _rows_mean(dropped.amax(dim=-1), rows)
    return response_mask * keep_all.to(response_mask.dtype), metrics


def rejection_metrics(option: str, statistic: torch.Tensor, keep_tokens: torch.Tensor, response_mask: torch.Tensor,
                      lower: float | None, upper: float) -> dict[str, torch.Tensor]:
    """``rollout_rs_{option}_*``: the statistic's mean / max / min / std over tokens (sequence options: over
    sequences for max / min), its per-sequence summary (mean, unbiased std, max, min, largest |value|, the share of
    sequences above the upper bound and, for k1 options, below the lower one), the share above / below the bounds,
    the share masked. The same keys as verl's ``compute_rs_metrics``."""
    prefix = f"rollout_rs_{option}"
    valid, rows = response_mask.bool(), _valid_rows(response_mask)
    dtype = statistic.dtype
    k1 = option.endswith("k1")
    hi, lo = (math.log(upper), math.log(lower)) if k1 else (upper, 0.0)
    per_token = statistic if statistic.dim() == 2 else statistic.unsqueeze(-1).expand_as(response_mask)
    per_seq = statistic if statistic.dim() == 1 else masked_mean(statistic, response_mask, dim=-1)
    over, under = (per_seq, rows) if statistic.dim() == 1 else (per_token, valid)
    clamped = per_token.clamp(min=lo, max=hi)
    variance = masked_mean(clamped.square(), response_mask) - masked_mean(clamped, response_mask).square()
    dropped = (~keep_tokens & valid).to(dtype)
    return {
        f"{prefix}_mean": masked_mean(per_token, response_mask),
        f"{prefix}_max": _masked_extreme(over, under, largest=True),
        f"{prefix}_min": _masked_extreme(over, under, largest=False),
        f"{prefix}_std": variance.clamp(min=0).sqrt(),
        f"{prefix}_fraction_high": masked_mean((over > hi).to(dtype), under),
        f"{prefix}_fraction_low": masked_mean((over < lo).to(dtype), under) if k1 else torch.zeros((), dtype=dtype),
        f"{prefix}_seq_mean": _rows_mean(per_seq, rows),
        f"{prefix}_seq_std": _unbiased_std(per_seq, rows),
        f"{prefix}_seq_fraction_high": _rows_mean((per_seq > hi).to(dtype), rows),
        **({f"{prefix}_seq_fraction_low": _rows_mean((per_seq < lo).to(dtype), rows)} if k1 else {}),
        f"{prefix}_seq_max": _masked_extreme(per_seq, rows, largest=True),
        f"{prefix}_seq_min": _masked_extreme(per_seq, rows, largest=False),
        f"{prefix}_seq_max_deviation": _masked_extreme(per_seq.abs(), rows, largest=True),
        f"{prefix}_masked_fraction": masked_mean(dropped, response_mask),
        f"{prefix}_seq_masked_fraction": _rows_mean(dropped.amax(dim=-1), rows),
    }


def _unbiased_std(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    count = rows.to(values.dtype).sum()
    mean = _rows_mean(values, rows)
    squares = masked_sum((values - mean).square(), rows)
    return torch.where(count > 1, squares / (count - 1).clamp(min=1), torch.zeros_like(squares)).sqrt()


def is_metrics(weights: torch.Tensor, raw_weights: torch.Tensor, log_ratio: torch.Tensor,
               response_mask: torch.Tensor, level: str, upper: float, lower: float | None) -> dict[str, torch.Tensor]:
    """``rollout_is_*``: the applied weights' mean / max / min / std and effective sample size (over tokens), the
    share of raw weights above ``upper`` / below ``lower`` (default ``1/upper``; per sequence at ``sequence`` level,
    where max / min are the raw sequence weights), the per-sequence means' summary; ``oob_ratio`` with MIS bounds."""
    valid, rows = response_mask.bool(), _valid_rows(response_mask)
    dtype = weights.dtype
    low = 1.0 / upper if lower is None else lower
    out: dict[str, torch.Tensor] = {"rollout_is_mean": masked_mean(weights, response_mask)}
    if level == "sequence":
        seq_log = _row_sum(log_ratio.detach(), response_mask)
        out["rollout_is_max"] = torch.exp(_masked_extreme(seq_log, rows, largest=True).clamp(max=SAFETY_BOUND))
        out["rollout_is_min"] = torch.exp(_masked_extreme(seq_log, rows, largest=False).clamp(max=SAFETY_BOUND))
        out["rollout_is_ratio_fraction_high"] = _rows_mean((seq_log > math.log(upper)).to(dtype), rows)
        out["rollout_is_ratio_fraction_low"] = _rows_mean((seq_log < math.log(low)).to(dtype), rows)
    else:
        out["rollout_is_max"] = _masked_extreme(weights, valid, largest=True)
        out["rollout_is_min"] = _masked_extreme(weights, valid, largest=False)
        out["rollout_is_ratio_fraction_high"] = masked_mean((raw_weights > upper).to(dtype), response_mask)
        out["rollout_is_ratio_fraction_low"] = masked_mean((raw_weights < low).to(dtype), response_mask)
    capped = weights.clamp(min=0.0, max=upper)
    mean = masked_mean(capped, response_mask)
    out["rollout_is_std"] = (masked_mean(capped.square(), response_mask) - mean.square()).clamp(min=0).sqrt()
    second = masked_mean((capped / (mean + 1e-8)).square(), response_mask)
    out["rollout_is_eff_sample_size"] = torch.where(second > 0, 1.0 / second, torch.zeros_like(second))
    seq_mean = masked_mean(weights, response_mask, dim=-1)
    raw_seq_mean = masked_mean(raw_weights, response_mask, dim=-1)
    out |= {
        "rollout_is_seq_mean": _rows_mean(seq_mean, rows),
        "rollout_is_seq_std": _unbiased_std(seq_mean, rows),
        "rollout_is_seq_max": _masked_extreme(seq_mean, rows, largest=True),
        "rollout_is_seq_min": _masked_extreme(seq_mean, rows, largest=False),
        "rollout_is_seq_max_deviation": _masked_extreme((seq_mean - 1.0).abs(), rows, largest=True),
        "rollout_is_seq_fraction_high": _rows_mean((raw_seq_mean > upper).to(dtype), rows),
        "rollout_is_seq_fraction_low": _rows_mean((raw_seq_mean < low).to(dtype), rows),
    }
    if lower is not None:
        outside = (raw_weights < lower) | (raw_weights > upper)
        out["rollout_is_oob_ratio"] = masked_mean(outside.to(dtype), response_mask)
    return out


def offpolicy_metrics(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor,
                      response_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gap between the trainer (``old_logprobs``) and the rollout engine, verl's names:

    ``kl`` = mean over tokens of ``rollout - old`` (KL(rollout || train), k1), ``k3_kl`` = mean of
    ``exp(log r) - log r - 1``; ``training_ppl`` / ``rollout_ppl`` = mean over sequences of ``exp(-mean_t logp)``
    (``*_log_ppl``: of ``-mean_t logp``); ``log_ppl_diff`` = mean over sequences of ``mean_t rollout - mean_t old``
    (``_abs_diff``, ``_max``, ``_min`` likewise); ``ppl_ratio`` = mean over sequences of ``exp(log_ppl_diff)``;
    ``chi2_token`` = mean over tokens of ``r^2`` minus 1; ``chi2_seq`` = mean over sequences of ``(prod_t r)^2``
    minus 1. As in verl, ``k3_kl`` takes ``log r`` unclamped, the chi-squares clamp it (and the row sum) to
    [-20, 20]. Sequences without a valid token are left out (verl counts them). Deliberate difference: verl asserts
    that the batch has a valid token; here such a batch gives 0 for every metric (both chi-squares included, where
    the formula would give -1).
    """
    rows = _valid_rows(response_mask)
    old, rollout = old_logprobs.detach(), rollout_logprobs.detach()
    log_ratio = old - rollout
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    unclamped = torch.where(response_mask.bool(), log_ratio, torch.zeros_like(log_ratio))  # padding may hold junk
    mean_old = masked_mean(old, response_mask, dim=-1)
    mean_rollout = masked_mean(rollout, response_mask, dim=-1)
    diff = mean_rollout - mean_old
    seq_log = _row_sum(log_ratio, response_mask).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    any_token, zero = rows.any(), torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device)
    return {
        "training_ppl": _rows_mean(torch.exp(-mean_old), rows),
        "training_log_ppl": _rows_mean(-mean_old, rows),
        "rollout_ppl": _rows_mean(torch.exp(-mean_rollout), rows),
        "rollout_log_ppl": _rows_mean(-mean_rollout, rows),
        "kl": masked_mean(rollout - old, response_mask),
        "k3_kl": masked_mean(torch.exp(unclamped) - unclamped - 1.0, response_mask),
        "log_ppl_diff": _rows_mean(diff, rows),
        "log_ppl_abs_diff": _rows_mean(diff.abs(), rows),
        "log_ppl_diff_max": _masked_extreme(diff, rows, largest=True),
        "log_ppl_diff_min": _masked_extreme(diff, rows, largest=False),
        "ppl_ratio": _rows_mean(torch.exp(diff), rows),
        # no valid token: 0 (nothing measured), not mean(empty) - 1 = -1, which no chi-square can be
        "chi2_token": torch.where(any_token, masked_mean(torch.exp(2.0 * safe), response_mask) - 1.0, zero),
        "chi2_seq": torch.where(any_token, _rows_mean(torch.exp(2.0 * seq_log), rows) - 1.0, zero),
    }


def rollout_correction(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, response_mask: torch.Tensor,
                       spec: RolloutCorrectionSpec) -> CorrectionOutput:
    """Weights, the rejection-filtered mask and every metric, for ``[B, T]`` log-probs of the trainer (``old``) and
    the rollout engine. With neither ``rollout_is`` nor ``rollout_rs`` set only the off-policy metrics come back."""
    if old_logprobs.shape != rollout_logprobs.shape or old_logprobs.shape != response_mask.shape:
        raise ValueError(f"rollout_correction: old_logprobs {tuple(old_logprobs.shape)}, rollout_logprobs "
                         f"{tuple(rollout_logprobs.shape)} and response_mask {tuple(response_mask.shape)} must match")
    log_ratio = (old_logprobs - rollout_logprobs).detach()
    metrics = dict(offpolicy_metrics(old_logprobs, rollout_logprobs, response_mask))
    weights = None
    if spec.rollout_is is not None:
        upper, lower = parse_is_threshold(spec.rollout_is_threshold)
        weights, raw = importance_weights(log_ratio, response_mask, spec.rollout_is, upper, lower)
        metrics |= is_metrics(weights, raw, log_ratio, response_mask, spec.rollout_is, upper, lower)
        if spec.rollout_is_batch_normalize:
            weights, factor = batch_normalize(weights, response_mask, spec.rollout_is)
            metrics["rollout_is_batch_norm_factor"] = factor
    mask = response_mask
    if spec.rollout_rs is not None:
        thresholds = parse_rs_thresholds(parse_rs_options(spec.rollout_rs), spec.rollout_rs_threshold)
        mask, rs_metrics = rejection_mask(log_ratio, response_mask, thresholds)
        metrics |= rs_metrics
    return CorrectionOutput(weights, mask, metrics)
