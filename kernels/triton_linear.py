"""Triton kernels for the fused linear -> log-prob / entropy and the full-vocabulary KL.

Two kernels serve both ops (``KL`` is a compile-time switch) and two ways of getting the logits (``FROM_LOGITS``):

- fused (backend ``"triton"``): each program computes a ``[block_n, block_v]`` logits tile as a matmul of a block of
  hidden states with a block of lm_head rows (``tl.dot``), and consumes it in registers / UB. Nothing of size
  ``[N, V]`` is ever written.
- split (backend ``"triton_mm"``): the library matmul (cuBLAS / the Ascend cube through torch_npu) writes a
  ``[N, vocab_chunk]`` logits chunk and the same kernels read it instead of computing it.

Forward (:func:`_fwd_kernel`): a program owns ``block_n`` rows and a range of vocabulary tiles, and keeps running
statistics per row with an online log-sum-exp (max ``m``, ``s = sum exp(z - m)``, ...). The ranges of one row are
combined afterwards (:func:`combine_partials`). With ``z = logits / T``:

- log-prob / entropy: ``t = sum exp(z - m) (z - m)``, ``x = z[target]``; ``lse = m + log s``, ``logprob = x - lse``,
  ``entropy = log s - t / s`` (``t`` is kept relative to the running max, so the entropy never cancels two large
  numbers).
- KL(pi || pi_ref) with ``y`` the reference's ``z``: ``t = sum exp(z - m) (z - y)``, and ``m_q, s_q`` for ``y``;
  ``kl = t / s - lse_p + lse_q``.

Padding columns (``col >= V``, any ``V``: verl #2656 gave positive log-probs when V was not a multiple of 256) are
``-inf`` before the max and excluded from every sum; the target logit is read from the same tile values that enter
the max, so ``logprob <= 0`` holds exactly.

Backward (:func:`_bwd_kernel`): for one vocabulary chunk, a program recomputes its logits tile and writes
``dL/dlogits`` (in the input dtype) into a ``[N, chunk]`` buffer; the caller then forms ``dW[chunk] = dl^T h`` and
``dh += dl W[chunk]`` with the library matmul (see :mod:`npu_rl.kernels.ops`). With ``p = exp(z - lse)``:

- log-prob: ``dz = g_lp (onehot(target) - p)``; entropy: ``dz = g_ent p (E[z] - z)``;
- KL: ``dz = g p ((z - y) - E_p[z - y])``; the reference is a constant (no gradient);
- ``dlogits = dz / T``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from npu_rl.kernels.tiles import TileConfig
from npu_rl.kernels._device import addmm_fp32_, default_dot_precision
from npu_rl.kernels.chunked_torch import combine_partials

NUM_STATS = {False: 4, True: 5}  # per-row statistics written by the forward kernel: (m, s, t, x) | (m, s, t, mq, sq)


@triton.jit
def _logits_tile(h_ptr, w_ptr, rows, cols, N, V, H, stride_h, stride_w,
                 BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
                 EVEN_K: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """float32 ``h[rows] @ w[cols].T`` ([BLOCK_N, BLOCK_V]); out-of-range rows / columns read zeros."""
    acc = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = rows < N
    col_ok = cols < V
    h_ptrs = h_ptr + rows[:, None].to(tl.int64) * stride_h + offs_k[None, :]
    w_ptrs = w_ptr + cols[:, None].to(tl.int64) * stride_w + offs_k[None, :]
    for k0 in range(0, H, BLOCK_K):
        if EVEN_K:
            a = tl.load(h_ptrs, mask=row_ok[:, None], other=0.0)
            b = tl.load(w_ptrs, mask=col_ok[:, None], other=0.0)
        else:
            k_ok = (k0 + offs_k) < H
            a = tl.load(h_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if UPCAST:  # the CPU interpreter computes bf16 dots wrongly; bf16 products are exact in float32
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
        h_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    return acc


@triton.jit
def _scaled_logits(src_ptr, w_ptr, rows, cols, v_base, N, V, H, stride_src, stride_w, inv_t,
                   FROM_LOGITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
                   BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """``logits / T`` for the tile: read from a logits chunk (columns from ``v_base``) or computed from ``h, w``."""
    if FROM_LOGITS:
        ptrs = src_ptr + rows[:, None].to(tl.int64) * stride_src + (cols - v_base)[None, :]
        z = tl.load(ptrs, mask=(rows < N)[:, None] & (cols < V)[None, :], other=0.0).to(tl.float32)
    else:
        z = _logits_tile(src_ptr, w_ptr, rows, cols, N, V, H, stride_src, stride_w,
                         BLOCK_N, BLOCK_V, BLOCK_K, EVEN_K, UPCAST, PRECISION)
    return z * inv_t[:, None]


@triton.jit
def _inv_temperature(temp_ptr, rows, N, inv_temp, TOKEN_TEMP: tl.constexpr, BLOCK_N: tl.constexpr):
    if TOKEN_TEMP:
        return 1.0 / tl.load(temp_ptr + rows, mask=rows < N, other=1.0).to(tl.float32)
    else:
        return tl.full((BLOCK_N,), 1.0, tl.float32) * inv_temp


@triton.jit
def _fwd_kernel(h_ptr, w_ptr, rh_ptr, rw_ptr, tgt_ptr, temp_ptr, part_ptr,
                N, V, H, RH, stride_h, stride_w, stride_rh, stride_rw, inv_temp,
                v_base, v_limit, split_offset, num_row_blocks, tiles_per_split,
                KL: tl.constexpr, NUM_STAT: tl.constexpr, TOKEN_TEMP: tl.constexpr, FROM_LOGITS: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
                EVEN_K: tl.constexpr, EVEN_RK: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    row_block = pid % num_row_blocks  # consecutive programs share a vocabulary range: its weight tiles stay in L2
    split = pid // num_row_blocks
    rows = row_block * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    inv_t = _inv_temperature(temp_ptr, rows, N, inv_temp, TOKEN_TEMP, BLOCK_N)
    m = tl.full((BLOCK_N,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK_N,), tl.float32)
    t = tl.zeros((BLOCK_N,), tl.float32)
    x = tl.zeros((BLOCK_N,), tl.float32)
    mq = tl.full((BLOCK_N,), float("-inf"), tl.float32)
    sq = tl.zeros((BLOCK_N,), tl.float32)
    if not KL:
        tgt = tl.load(tgt_ptr + rows, mask=row_ok, other=-1)
    v_start = v_base + split * tiles_per_split * BLOCK_V
    v_stop = tl.minimum(v_limit, v_start + tiles_per_split * BLOCK_V)
    for v0 in range(v_start, v_stop, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < v_limit
        z = _scaled_logits(h_ptr, w_ptr, rows, cols, v_base, N, v_limit, H, stride_h, stride_w, inv_t,
                           FROM_LOGITS, BLOCK_N, BLOCK_V, BLOCK_K, EVEN_K, UPCAST, PRECISION)
        z = tl.where(col_ok[None, :], z, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, axis=1))
        alpha = tl.exp(m - m_new)
        e = tl.exp(z - m_new[:, None])
        if KL:
            y = _scaled_logits(rh_ptr, rw_ptr, rows, cols, v_base, N, v_limit, RH, stride_rh, stride_rw, inv_t,
                               FROM_LOGITS, BLOCK_N, BLOCK_V, BLOCK_K, EVEN_RK, UPCAST, PRECISION)
            t = t * alpha + tl.sum(e * tl.where(col_ok[None, :], z - y, 0.0), axis=1)
            y = tl.where(col_ok[None, :], y, float("-inf"))
            mq_new = tl.maximum(mq, tl.max(y, axis=1))
            sq = sq * tl.exp(mq - mq_new) + tl.sum(tl.exp(y - mq_new[:, None]), axis=1)
            mq = mq_new
        else:
            shift = (tl.where(s > 0, m, m_new) - m_new) * s  # re-centre t on the new max (0 before any column)
            t = alpha * (t + shift) + tl.sum(e * tl.where(col_ok[None, :], z - m_new[:, None], 0.0), axis=1)
            x += tl.sum(tl.where((cols[None, :] == tgt[:, None]) & col_ok[None, :], z, 0.0), axis=1)
        s = s * alpha + tl.sum(e, axis=1)
        m = m_new
    base = part_ptr + (split_offset + split) * NUM_STAT * N + rows
    tl.store(base, m, mask=row_ok)
    tl.store(base + N, s, mask=row_ok)
    tl.store(base + 2 * N, t, mask=row_ok)
    if KL:
        tl.store(base + 3 * N, mq, mask=row_ok)
        tl.store(base + 4 * N, sq, mask=row_ok)
    else:
        tl.store(base + 3 * N, x, mask=row_ok)


@triton.jit
def _bwd_kernel(h_ptr, w_ptr, rh_ptr, rw_ptr, tgt_ptr, temp_ptr, lse_ptr, aux_ptr, g0_ptr, g1_ptr, out_ptr,
                N, H, RH, stride_h, stride_w, stride_rh, stride_rw, stride_out, inv_temp,
                v_lo, v_hi, num_row_blocks, num_col_blocks,
                KL: tl.constexpr, TOKEN_TEMP: tl.constexpr, FROM_LOGITS: tl.constexpr,
                HAS_G0: tl.constexpr, HAS_G1: tl.constexpr, GROUP_N: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
                EVEN_K: tl.constexpr, EVEN_RK: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    # Grouped order: GROUP_N row blocks sweep the columns together, so each weight tile is read from L2 GROUP_N times.
    per_group = GROUP_N * num_col_blocks
    first_row_block = (pid // per_group) * GROUP_N
    group_rows = tl.minimum(num_row_blocks - first_row_block, GROUP_N)
    row_block = first_row_block + (pid % per_group) % group_rows
    col_block = (pid % per_group) // group_rows
    rows = row_block * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = v_lo + col_block * BLOCK_V + tl.arange(0, BLOCK_V)
    row_ok = rows < N
    col_ok = cols < v_hi
    inv_t = _inv_temperature(temp_ptr, rows, N, inv_temp, TOKEN_TEMP, BLOCK_N)
    # (out_ptr is also the logits source when FROM_LOGITS: each element is read, then overwritten, by one program)
    z = _scaled_logits(h_ptr, w_ptr, rows, cols, v_lo, N, v_hi, H, stride_h, stride_w, inv_t,
                       FROM_LOGITS, BLOCK_N, BLOCK_V, BLOCK_K, EVEN_K, UPCAST, PRECISION)
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    aux = tl.load(aux_ptr + rows, mask=row_ok, other=0.0)  # E[z] (log-prob / entropy) | E_p[z - y] (KL)
    p = tl.exp(z - lse[:, None])
    if KL:
        y = _scaled_logits(rh_ptr, rw_ptr, rows, cols, v_lo, N, v_hi, RH, stride_rh, stride_rw, inv_t,
                           FROM_LOGITS, BLOCK_N, BLOCK_V, BLOCK_K, EVEN_RK, UPCAST, PRECISION)
        g = tl.load(g0_ptr + rows, mask=row_ok, other=0.0)
        dz = g[:, None] * p * ((z - y) - aux[:, None])
    else:
        dz = tl.zeros((BLOCK_N, BLOCK_V), tl.float32)
        if HAS_G0:
            g_lp = tl.load(g0_ptr + rows, mask=row_ok, other=0.0)
            tgt = tl.load(tgt_ptr + rows, mask=row_ok, other=-1)
            dz += g_lp[:, None] * (tl.where(cols[None, :] == tgt[:, None], 1.0, 0.0) - p)
        if HAS_G1:
            g_ent = tl.load(g1_ptr + rows, mask=row_ok, other=0.0)
            dz += g_ent[:, None] * p * (aux[:, None] - z)
    dl = dz * inv_t[:, None]
    out_ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_out + (cols - v_lo)[None, :]
    tl.store(out_ptrs, dl.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


# --------------------------------------------------------------------------- launchers
def _compile_flags(h: torch.Tensor, interpreted: bool) -> dict:
    upcast = interpreted and h.dtype != torch.float32
    return {"UPCAST": upcast,
            "PRECISION": "ieee" if (h.dtype == torch.float32 or upcast) else default_dot_precision()}


def launch_forward(*, hidden, weight, targets, temperature, inv_temp, part, tile: TileConfig, interpreted: bool,
                   ref_hidden=None, ref_weight=None, logits=None, ref_logits=None, v_base=0, v_limit=None,
                   split_offset=0, num_splits=1) -> None:
    """Fill ``part[split_offset : split_offset + num_splits]`` ([S, NUM_STATS, N] float32) for columns
    ``[v_base, v_limit)``. Fused when ``logits`` is None; else read ``logits`` (and ``ref_logits``), whose column 0
    is vocabulary column ``v_base``."""
    kl = ref_hidden is not None or ref_logits is not None
    from_logits = logits is not None
    N, H = hidden.shape
    v_limit = weight.shape[0] if v_limit is None else v_limit
    num_tiles = triton.cdiv(v_limit - v_base, tile.block_v)
    tiles_per_split = triton.cdiv(num_tiles, num_splits)
    num_row_blocks = triton.cdiv(N, tile.block_n)
    src, rsrc = (logits, ref_logits) if from_logits else (hidden, ref_hidden)
    rsrc = src if rsrc is None else rsrc
    rw = weight if ref_weight is None else ref_weight
    RH = ref_hidden.shape[1] if ref_hidden is not None else H
    _fwd_kernel[(num_row_blocks * num_splits,)](
        src, weight, rsrc, rw, part if kl else targets, part if temperature is None else temperature, part,
        N, v_limit, H, RH, src.stride(0), weight.stride(0), rsrc.stride(0), rw.stride(0), inv_temp,
        v_base, v_limit, split_offset, num_row_blocks, tiles_per_split,
        KL=kl, NUM_STAT=NUM_STATS[kl], TOKEN_TEMP=temperature is not None, FROM_LOGITS=from_logits,
        BLOCK_N=tile.block_n, BLOCK_V=tile.block_v, BLOCK_K=tile.block_k,
        EVEN_K=H % tile.block_k == 0, EVEN_RK=RH % tile.block_k == 0,
        num_warps=tile.warps, num_stages=tile.stages, **_compile_flags(hidden, interpreted),
    )


def launch_backward(*, hidden, weight, targets, temperature, inv_temp, lse, aux, g0, g1, out, v_lo, v_hi,
                    tile: TileConfig, interpreted: bool, ref_hidden=None, ref_weight=None, ref_logits=None,
                    from_logits=False) -> None:
    """Write ``dL/dlogits`` for columns ``[v_lo, v_hi)`` into ``out`` ([N, >= v_hi - v_lo], row stride free).
    When ``from_logits``, ``out`` holds the logits chunk on entry (and ``ref_logits`` the reference's)."""
    kl = ref_hidden is not None or ref_logits is not None
    N, H = hidden.shape
    num_row_blocks = triton.cdiv(N, tile.block_n)
    num_col_blocks = triton.cdiv(v_hi - v_lo, tile.block_v)
    src, rsrc = (out, ref_logits) if from_logits else (hidden, ref_hidden)
    rsrc = src if rsrc is None else rsrc
    rw = weight if ref_weight is None else ref_weight
    RH = ref_hidden.shape[1] if ref_hidden is not None else H
    dummy = lse  # stands in for absent optional pointers; never read
    _bwd_kernel[(num_row_blocks * num_col_blocks,)](
        src, weight, rsrc, rw, dummy if kl else targets, dummy if temperature is None else temperature, lse, aux,
        g0 if g0 is not None else dummy, g1 if g1 is not None else dummy, out,
        N, H, RH, src.stride(0), weight.stride(0), rsrc.stride(0), rw.stride(0), out.stride(0), inv_temp,
        v_lo, v_hi, num_row_blocks, num_col_blocks,
        KL=kl, TOKEN_TEMP=temperature is not None, FROM_LOGITS=from_logits,
        HAS_G0=g0 is not None, HAS_G1=g1 is not None, GROUP_N=8,
        BLOCK_N=tile.block_n, BLOCK_V=tile.block_v, BLOCK_K=tile.block_k,
        EVEN_K=H % tile.block_k == 0, EVEN_RK=RH % tile.block_k == 0,
        num_warps=tile.warps, num_stages=tile.stages, **_compile_flags(hidden, interpreted),
    )


# --------------------------------------------------------------------------- drivers (one per direction, both modes)
def forward(hidden, weight, targets, temperature, inv_temp, *, mode, tile, num_cores, vocab_chunk_size,
            interpreted, ref_hidden=None, ref_weight=None) -> dict[str, torch.Tensor]:
    """Per-row results (see :func:`npu_rl.kernels.chunked_torch.combine_partials`).

    ``mode="fused"``: one launch; the vocabulary is split into ``S`` ranges so that the grid has about two programs
    per core even for few tokens, and the ranges are merged afterwards. ``mode="mm"``: a logits chunk per
    ``vocab_chunk_size`` columns from the library matmul, one launch per chunk.
    """
    kl = ref_hidden is not None
    num_tokens, vocab = hidden.shape[0], weight.shape[0]
    common = dict(hidden=hidden, weight=weight, targets=targets, temperature=temperature, inv_temp=inv_temp,
                  tile=tile, interpreted=interpreted, ref_hidden=ref_hidden, ref_weight=ref_weight)
    if mode == "fused":
        num_tiles = triton.cdiv(vocab, tile.block_v)
        splits = min(num_tiles, max(1, triton.cdiv(2 * num_cores, triton.cdiv(num_tokens, tile.block_n))))
        splits = triton.cdiv(num_tiles, triton.cdiv(num_tiles, splits))  # no empty range
        part = torch.empty(splits, NUM_STATS[kl], num_tokens, dtype=torch.float32, device=hidden.device)
        launch_forward(part=part, num_splits=splits, **common)
    else:
        starts = range(0, vocab, vocab_chunk_size)
        part = torch.empty(len(starts), NUM_STATS[kl], num_tokens, dtype=torch.float32, device=hidden.device)
        buf = _chunk_buffer(hidden, num_tokens * min(vocab, vocab_chunk_size))
        rbuf = _chunk_buffer(ref_hidden, buf.numel()) if kl else None
        for c, v0 in enumerate(starts):
            v1 = min(vocab, v0 + vocab_chunk_size)
            logits = torch.mm(hidden, weight[v0:v1].t(), out=_view(buf, num_tokens, v1 - v0))
            ref_logits = None
            if kl:
                ref_logits = torch.mm(ref_hidden, ref_weight[v0:v1].t(), out=_view(rbuf, num_tokens, v1 - v0))
            launch_forward(part=part, logits=logits, ref_logits=ref_logits, v_base=v0, v_limit=v1, split_offset=c,
                           **common)

    return combine_partials(part, kl)


def backward(hidden, weight, targets, temperature, inv_temp, lse, aux, g0, g1, *, need_dh, need_dw, mode, tile,
             vocab_chunk_size, interpreted, ref_hidden=None, ref_weight=None):
    """(dhidden, dweight): per vocabulary chunk, ``dl = dL/dlogits`` [N, chunk] from the kernel, then
    ``dW[chunk] = dl^T h`` (one matmul, no accumulation) and ``dh += dl W[chunk]`` (float32 accumulator)."""
    kl = ref_hidden is not None
    num_tokens, vocab = hidden.shape[0], weight.shape[0]
    buf = _chunk_buffer(hidden, num_tokens * min(vocab, vocab_chunk_size))
    rbuf = _chunk_buffer(ref_hidden, buf.numel()) if kl and mode == "mm" else None
    dh_acc = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_dh else None
    dweight = torch.empty_like(weight) if need_dw else None
    for v0 in range(0, vocab, vocab_chunk_size):
        v1 = min(vocab, v0 + vocab_chunk_size)
        dl = _view(buf, num_tokens, v1 - v0)
        ref_logits = None
        if mode == "mm":
            torch.mm(hidden, weight[v0:v1].t(), out=dl)
            if kl:
                ref_logits = torch.mm(ref_hidden, ref_weight[v0:v1].t(), out=_view(rbuf, num_tokens, v1 - v0))
        launch_backward(hidden=hidden, weight=weight, targets=targets, temperature=temperature, inv_temp=inv_temp,
                        lse=lse, aux=aux, g0=g0, g1=g1, out=dl, v_lo=v0, v_hi=v1, tile=tile, interpreted=interpreted,
                        ref_hidden=None if mode == "mm" else ref_hidden, ref_weight=ref_weight,
                        ref_logits=ref_logits, from_logits=mode == "mm")
        if need_dw:
            torch.mm(dl.t(), hidden, out=dweight[v0:v1])
        if need_dh:
            addmm_fp32_(dh_acc, dl, weight[v0:v1])
    return (dh_acc.to(hidden.dtype) if need_dh else None), dweight


def _chunk_buffer(like: torch.Tensor, numel: int) -> torch.Tensor:
    return torch.empty(numel, dtype=like.dtype, device=like.device)


def _view(buf: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """A contiguous [rows, cols] view of the front of ``buf`` (the last, narrower chunk reuses the same memory)."""
    return buf[: rows * cols].view(rows, cols)
