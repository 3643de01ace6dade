"""Chunked torch implementation of the fused linear ops: the reference for the Triton kernels and the fallback on
CPU and on NPUs without triton-ascend.

It computes exactly what :mod:`npu_rl.kernels.triton_linear` computes, chunk by chunk with torch ops: the
forward walks ``[chunk_size, vocab_chunk_size]`` logits blocks with the same online log-sum-exp statistics, the
backward walks vocabulary chunks (outer) and token chunks (inner), recomputes each logits block and accumulates
``dW`` and ``dh`` in float32. Peak extra memory is a few float32 blocks of ``chunk_size x vocab_chunk_size`` plus the
float32 gradient accumulators, never ``[N, V]``. Logits are formed by the library matmul in the input dtype (as a
plain ``hidden @ weight.T`` would) and upcast to float32.
"""

from __future__ import annotations

import torch

from npu_rl.kernels._device import addmm_fp32_


def combine_partials(part: torch.Tensor, kl: bool) -> dict[str, torch.Tensor]:
    """Merge per-vocabulary-range statistics ``part`` [S, NUM_STATS, N] into per-row results (float32 [N]).

    Rows of ``part`` (see :mod:`npu_rl.kernels.triton_linear`): log-prob / entropy ``(m, s, t, x)`` with
    ``t = sum exp(z - m) (z - m)``; KL ``(m, s, t, mq, sq)`` with ``t = sum exp(z - m) (z - y)``.
    Returns ``logprobs, entropy, lse, mean_z`` (E[z]) or ``kl, lse, mean_d`` (E_p[z - y]); ``lse`` is the policy's.
    """
    m, s, t = part[:, 0], part[:, 1], part[:, 2]
    m_max = m.max(dim=0).values
    scale = torch.exp(m - m_max)
    s_all = (scale * s).sum(dim=0)
    lse = m_max + torch.log(s_all)
    if kl:
        mean_d = (scale * t).sum(dim=0) / s_all
        mq, sq = part[:, 3], part[:, 4]
        mq_max = mq.max(dim=0).values
        lse_q = mq_max + torch.log((torch.exp(mq - mq_max) * sq).sum(dim=0))
        return {"kl": mean_d - lse + lse_q, "lse": lse, "mean_d": mean_d}
    t_all = (scale * (t + s * (m - m_max))).sum(dim=0)
    entropy = torch.log(s_all) - t_all / s_all
    return {"logprobs": part[:, 3].sum(dim=0) - lse, "entropy": entropy, "lse": lse, "mean_z": lse - entropy}


def _scaled_logits(hidden: torch.Tensor, weight: torch.Tensor, inv_t: torch.Tensor | float) -> torch.Tensor:
    """float32 ``(hidden @ weight.T) / T`` for one block; ``inv_t`` is a float or a [n, 1] column."""
    return torch.mm(hidden, weight.t()).float() * inv_t


def _inv_t(temperature: torch.Tensor | None, inv_temp: float, n0: int, n1: int) -> torch.Tensor | float:
    return inv_temp if temperature is None else (1.0 / temperature[n0:n1]).unsqueeze(1)


def forward(hidden, weight, targets, temperature, inv_temp, *, chunk_size, vocab_chunk_size,
            ref_hidden=None, ref_weight=None) -> dict[str, torch.Tensor]:
    """Per-row results of :func:`combine_partials` (see there), one token chunk at a time."""
    kl = ref_hidden is not None
    num_tokens, vocab = hidden.shape[0], weight.shape[0]
    part = torch.empty(1, 5 if kl else 4, num_tokens, dtype=torch.float32, device=hidden.device)
    for n0 in range(0, num_tokens, chunk_size):
        n1 = min(num_tokens, n0 + chunk_size)
        inv_t = _inv_t(temperature, inv_temp, n0, n1)
        stats = [torch.full((n1 - n0,), float("-inf"), device=hidden.device)] + [
            torch.zeros(n1 - n0, device=hidden.device) for _ in range(3)
        ]
        m, s, t, x = stats
        mq, sq = stats[0].clone(), torch.zeros_like(s)
        for v0 in range(0, vocab, vocab_chunk_size):
            v1 = min(vocab, v0 + vocab_chunk_size)
            z = _scaled_logits(hidden[n0:n1], weight[v0:v1], inv_t)  # [n, v]
            m_new = torch.maximum(m, z.amax(dim=1))
            alpha = torch.exp(m - m_new)
            e = torch.exp(z - m_new[:, None])
            if kl:
                y = _scaled_logits(ref_hidden[n0:n1], ref_weight[v0:v1], inv_t)
                t = t * alpha + (e * (z - y)).sum(dim=1)
                mq_new = torch.maximum(mq, y.amax(dim=1))
                sq = sq * torch.exp(mq - mq_new) + torch.exp(y - mq_new[:, None]).sum(dim=1)
                mq = mq_new
            else:
                shift = (torch.where(s > 0, m, m_new) - m_new) * s  # re-centre t on the new max (0 at first)
                t = alpha * (t + shift) + (e * (z - m_new[:, None])).sum(dim=1)
                local = targets[n0:n1] - v0
                hit = (local >= 0) & (local < v1 - v0)
                x = x + torch.where(hit, z.gather(1, local.clamp(0, v1 - v0 - 1)[:, None]).squeeze(1), 0.0)
            s = s * alpha + e.sum(dim=1)
            m = m_new
        rows = (m, s, t, mq, sq) if kl else (m, s, t, x)
        for i, row in enumerate(rows):
            part[0, i, n0:n1] = row
    return combine_partials(part, kl)


def backward(hidden, weight, targets, temperature, inv_temp, lse, aux, g0, g1, *, need_dh, need_dw,
             chunk_size, vocab_chunk_size, ref_hidden=None, ref_weight=None):
    """(dhidden, dweight) from the upstream grads ``g0`` (log-probs | KL) and ``g1`` (entropy), either may be None.

    ``aux`` is ``mean_z`` (log-prob / entropy) or ``mean_d`` (KL) from :func:`forward`.
    """
    kl = ref_hidden is not None
    num_tokens, vocab = hidden.shape[0], weight.shape[0]
    dh_acc = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_dh else None
    dweight = torch.empty_like(weight) if need_dw else None
    for v0 in range(0, vocab, vocab_chunk_size):
        v1 = min(vocab, v0 + vocab_chunk_size)
        w_chunk = weight[v0:v1]
        dw_acc = torch.zeros(w_chunk.shape, dtype=torch.float32, device=weight.device) if need_dw else None
        for n0 in range(0, num_tokens, chunk_size):
            n1 = min(num_tokens, n0 + chunk_size)
            inv_t = _inv_t(temperature, inv_temp, n0, n1)
            z = _scaled_logits(hidden[n0:n1], w_chunk, inv_t)
            p = torch.exp(z - lse[n0:n1, None])
            if kl:
                y = _scaled_logits(ref_hidden[n0:n1], ref_weight[v0:v1], inv_t)
                dz = g0[n0:n1, None] * p * ((z - y) - aux[n0:n1, None])
            else:
                dz = torch.zeros_like(z)
                if g0 is not None:  # g_lp * (onehot(target) - p)
                    dz = -g0[n0:n1, None] * p
                    local = targets[n0:n1] - v0
                    hit = (local >= 0) & (local < v1 - v0)
                    dz.scatter_add_(1, local.clamp(0, v1 - v0 - 1)[:, None], torch.where(hit, g0[n0:n1], 0.0)[:, None])
                if g1 is not None:  # g_ent * p * (E[z] - z)
                    dz = dz + g1[n0:n1, None] * p * (aux[n0:n1, None] - z)
            dlogits = (dz * inv_t).to(hidden.dtype)
            if need_dw:
                addmm_fp32_(dw_acc, dlogits.t(), hidden[n0:n1])
            if need_dh:
                addmm_fp32_(dh_acc[n0:n1], dlogits, w_chunk)
        if need_dw:
            dweight[v0:v1] = dw_acc
    return (dh_acc.to(hidden.dtype) if need_dh else None), dweight
