"""Triton kernels for :func:`npu_rl.kernels.policy_loss_and_kl`: one elementwise pass forward, one backward.

Forward reads ``logprobs, old_logprobs, advantages`` (+ ``ref_logprobs``, ``weights``) once and writes the policy
loss, the KL estimate, both clip flags and the clamped log-ratio. Backward reads the same inputs and the two
upstream gradients and writes ``dL/dlogprobs``; the derivative is written out by hand to match torch autograd of
the reference formulas in :mod:`npu_rl.kernels.policy_kl`, ties included.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from npu_rl.kernels.policy_types import _KL_CODE, PolicyKLOutput, _check_kl_type

BLOCK = 1024


@triton.jit
def _ppo_terms(lp, old, adv, clip_low, clip_high, clip_c):
    raw = lp - old
    log_ratio = tl.minimum(tl.maximum(raw, -20.0), 20.0)
    ratio = tl.exp(log_ratio)
    pg1 = -adv * ratio
    pg2 = -adv * tl.minimum(tl.maximum(ratio, 1.0 - clip_low), 1.0 + clip_high)
    cp1 = tl.maximum(pg1, pg2)
    pg3 = -adv * clip_c
    return raw, log_ratio, ratio, pg1, pg2, cp1, pg3


@triton.jit
def _fwd(lp_ptr, old_ptr, adv_ptr, ref_ptr, w_ptr, pg_ptr, kl_ptr, clip_ptr, clip_lo_ptr, lr_ptr, numel,
         clip_low, clip_high, clip_c, KL_KIND: tl.constexpr, HAS_W: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    lp = tl.load(lp_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    old = tl.load(old_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    adv = tl.load(adv_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    raw, log_ratio, ratio, pg1, pg2, cp1, pg3 = _ppo_terms(lp, old, adv, clip_low, clip_high, clip_c)
    pg = tl.where(adv < 0, tl.minimum(pg3, cp1), cp1)
    if HAS_W:
        pg = pg * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(pg_ptr + offs, pg, mask=mask)
    tl.store(clip_ptr + offs, tl.where(pg2 > pg1, 1.0, 0.0), mask=mask)
    tl.store(clip_lo_ptr + offs, tl.where((cp1 > pg3) & (adv < 0), 1.0, 0.0), mask=mask)
    tl.store(lr_ptr + offs, log_ratio, mask=mask)
    if KL_KIND != 0:
        d = lp - tl.load(ref_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if KL_KIND == 1:
            kl = d
        elif KL_KIND == 2:
            kl = tl.abs(d)
        elif KL_KIND == 3:
            kl = 0.5 * d * d
        else:
            neg = tl.minimum(tl.maximum(-d, -20.0), 20.0)
            kl = tl.minimum(tl.maximum(tl.exp(neg) - neg - 1.0, -10.0), 10.0)
        tl.store(kl_ptr + offs, kl, mask=mask)


@triton.jit
def _tie_weight(a, b):
    """d max(a, b) / d a as torch computes it: 1 if a > b, 1/2 at a tie, else 0."""
    return tl.where(a > b, 1.0, tl.where(a == b, 0.5, 0.0))


@triton.jit
def _bwd(lp_ptr, old_ptr, adv_ptr, ref_ptr, w_ptr, g_pg_ptr, g_kl_ptr, out_ptr, numel,
         clip_low, clip_high, clip_c, KL_KIND: tl.constexpr, STRAIGHT_THROUGH: tl.constexpr,
         HAS_W: tl.constexpr, HAS_G_PG: tl.constexpr, HAS_G_KL: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    lp = tl.load(lp_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    grad = tl.zeros((BLOCK,), tl.float32)
    if HAS_G_PG:
        old = tl.load(old_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        adv = tl.load(adv_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        raw, log_ratio, ratio, pg1, pg2, cp1, pg3 = _ppo_terms(lp, old, adv, clip_low, clip_high, clip_c)
        w1 = _tie_weight(pg1, pg2)  # share of max(pg1, pg2)'s gradient going to pg1; 1 - w1 to pg2
        in_range = (ratio >= 1.0 - clip_low) & (ratio <= 1.0 + clip_high)
        d_cp1 = -adv * (w1 + (1.0 - w1) * tl.where(in_range, 1.0, 0.0))
        d_pg = tl.where(adv < 0, _tie_weight(pg3, cp1) * d_cp1, d_cp1)  # min(pg3, cp1): cp1's share
        if HAS_W:
            d_pg = d_pg * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        unclamped = (raw >= -20.0) & (raw <= 20.0)
        g_pg = tl.load(g_pg_ptr + offs, mask=mask, other=0.0)
        grad += tl.where(unclamped, g_pg * d_pg * ratio, 0.0)
    if HAS_G_KL:
        d = lp - tl.load(ref_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if STRAIGHT_THROUGH or KL_KIND == 3:
            d_kl = d
        elif KL_KIND == 1:
            d_kl = tl.full((BLOCK,), 1.0, tl.float32)
        elif KL_KIND == 2:
            d_kl = tl.where(d > 0, 1.0, tl.where(d < 0, -1.0, 0.0))
        else:
            neg = -d
            clamped = tl.minimum(tl.maximum(neg, -20.0), 20.0)
            value = tl.exp(clamped) - clamped - 1.0
            passes = (neg >= -20.0) & (neg <= 20.0) & (value >= -10.0) & (value <= 10.0)
            d_kl = tl.where(passes, 1.0 - tl.exp(clamped), 0.0)
        grad += tl.load(g_kl_ptr + offs, mask=mask, other=0.0) * d_kl
    tl.store(out_ptr + offs, grad, mask=mask)


class _PolicyKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logprobs, old, adv, ref, weights, clip_low, clip_high, clip_c, kl_kind, straight_through):
        ctx.set_materialize_grads(False)
        numel = logprobs.numel()
        outs = [torch.empty(numel, dtype=torch.float32, device=logprobs.device) for _ in range(5)]
        pg, kl, clip, clip_lo, log_ratio = outs
        dummy = logprobs
        grid = (triton.cdiv(numel, BLOCK),)
        _fwd[grid](logprobs, old, adv, dummy if ref is None else ref, dummy if weights is None else weights,
                   pg, kl, clip, clip_lo, log_ratio, numel, clip_low, clip_high, clip_c,
                   KL_KIND=kl_kind, HAS_W=weights is not None, BLOCK=BLOCK)
        ctx.save_for_backward(logprobs, old, adv, ref, weights)
        ctx.params = (clip_low, clip_high, clip_c, kl_kind, straight_through)
        ctx.mark_non_differentiable(clip, clip_lo, log_ratio)
        return pg, kl, clip, clip_lo, log_ratio

    @staticmethod
    def backward(ctx, g_pg, g_kl, *_):
        logprobs, old, adv, ref, weights = ctx.saved_tensors
        clip_low, clip_high, clip_c, kl_kind, straight_through = ctx.params
        numel = logprobs.numel()
        has_g_kl = g_kl is not None and kl_kind != 0
        grad = torch.empty(numel, dtype=torch.float32, device=logprobs.device)
        dummy = logprobs
        _bwd[(triton.cdiv(numel, BLOCK),)](
            logprobs, old, adv, dummy if ref is None else ref, dummy if weights is None else weights,
            dummy if g_pg is None else g_pg.float().contiguous(), g_kl.float().contiguous() if has_g_kl else dummy,
            grad, numel, clip_low, clip_high, clip_c, KL_KIND=kl_kind, STRAIGHT_THROUGH=straight_through,
            HAS_W=weights is not None, HAS_G_PG=g_pg is not None, HAS_G_KL=has_g_kl, BLOCK=BLOCK)
        return grad.to(logprobs.dtype), None, None, None, None, None, None, None, None, None


def policy_loss_and_kl_triton(logprobs, old_logprobs, advantages, ref_logprobs=None, *, clip_ratio_low,
                              clip_ratio_high, clip_ratio_c, kl_type, weights) -> PolicyKLOutput:
    base, straight_through = _check_kl_type(kl_type)
    kl_kind = 0 if ref_logprobs is None else _KL_CODE[base]
    shape = logprobs.shape

    def flat(t):
        return None if t is None else t.detach().reshape(-1).contiguous()

    pg, kl, clip, clip_lo, log_ratio = _PolicyKL.apply(
        logprobs.reshape(-1).contiguous(), flat(old_logprobs), flat(advantages), flat(ref_logprobs), flat(weights),
        float(clip_ratio_low), float(clip_ratio_high), float(clip_ratio_c), kl_kind, straight_through)
    return PolicyKLOutput(pg.view(shape), kl.view(shape) if kl_kind else None, clip.view(shape),
                          clip_lo.view(shape), log_ratio.view(shape))
