"""Public fused linear ops: log-prob + entropy of the target token, and the full-vocabulary KL, from hidden states.

Both take the last hidden states ``[..., H]`` and the lm_head weight ``[V, H]`` and never hold ``[N, V]`` logits.
Three interchangeable implementations sit behind one autograd function per op:

- ``torch``: :mod:`npu_rl.kernels.chunked_torch` (reference; CPU and NPU-without-Triton fallback);
- ``triton``: :mod:`npu_rl.kernels.triton_linear` with the matmul fused into the kernels (tiles per device);
- ``triton_mm``: the same kernels reading logits chunks that the library matmul wrote.

``backend="auto"`` picks ``triton_mm`` for tensors on an accelerator with Triton installed, else ``torch``
(:func:`npu_rl.kernels._device.resolve_backend`): on the H200 the library matmul plus Triton epilogues beat the
fully fused kernels at every measured shape (docs/benchmarks.md), and its Triton kernels use no ``tl.dot``, the
simplest case for triton-ascend. Outputs are float32.

Memory: forward keeps per-token statistics only; backward materialises one ``[N, vocab_chunk_size]`` chunk of
``dL/dlogits`` (``triton*``; by default sized to ``DEFAULT_CHUNK_BYTES``) or a few ``[chunk_size,
vocab_chunk_size]`` float32 blocks (``torch``), plus float32 accumulators for ``dhidden`` ([N, H]).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from npu_rl.kernels import _device, chunked_torch
from npu_rl.kernels.tiles import TileConfig, num_cores, select_row_tiles, select_tiles

DEFAULT_CHUNK_BYTES = 1 << 30  # the triton backends' [N, vocab_chunk] gradient chunk
TORCH_TOKEN_CHUNK = 2048
TORCH_VOCAB_CHUNK = 16384


@dataclass(frozen=True)
class _Plan:
    """Which implementation runs, and its chunking / tiling."""

    backend: str  # "torch" | "triton" | "triton_mm"
    chunk_size: int  # tokens per block (torch)
    vocab_chunk_size: int  # vocabulary columns per chunk
    tile: TileConfig | None = None
    num_cores: int = 1
    interpreted: bool = False

    def forward(self, hidden, weight, targets, temperature, inv_temp, ref_hidden=None, ref_weight=None):
        if self.backend == "torch":
            return chunked_torch.forward(hidden, weight, targets, temperature, inv_temp, chunk_size=self.chunk_size,
                                         vocab_chunk_size=self.vocab_chunk_size, ref_hidden=ref_hidden,
                                         ref_weight=ref_weight)
        from npu_rl.kernels import triton_linear

        return triton_linear.forward(hidden, weight, targets, temperature, inv_temp, mode=self._mode,
                                     tile=self.tile, num_cores=self.num_cores, vocab_chunk_size=self.vocab_chunk_size,
                                     interpreted=self.interpreted, ref_hidden=ref_hidden, ref_weight=ref_weight)

    def backward(self, hidden, weight, targets, temperature, inv_temp, lse, aux, g0, g1, need_dh, need_dw,
                 ref_hidden=None, ref_weight=None):
        g0 = None if g0 is None else g0.float().contiguous()
        g1 = None if g1 is None else g1.float().contiguous()
        kwargs = dict(need_dh=need_dh, need_dw=need_dw, vocab_chunk_size=self.vocab_chunk_size,
                      ref_hidden=ref_hidden, ref_weight=ref_weight)
        args = (hidden, weight, targets, temperature, inv_temp, lse, aux, g0, g1)
        if self.backend == "torch":
            return chunked_torch.backward(*args, chunk_size=self.chunk_size, **kwargs)
        from npu_rl.kernels import triton_linear

        return triton_linear.backward(*args, mode=self._mode, tile=self.tile, interpreted=self.interpreted, **kwargs)

    @property
    def _mode(self) -> str:
        return "fused" if self.backend == "triton" else "mm"


@functools.lru_cache(maxsize=None)
def _device_tiles(kind: str, itemsize: int, mode: str) -> TileConfig:
    return select_tiles(kind, itemsize) if mode == "triton" else select_row_tiles(kind)


def _plan(backend, hidden, vocab, chunk_size, vocab_chunk_size, tiles, num_buffers=1) -> _Plan:
    backend = _device.resolve_backend(backend, hidden)
    num_tokens = hidden.shape[0]
    if backend == "torch":
        return _Plan("torch", chunk_size or TORCH_TOKEN_CHUNK, vocab_chunk_size or TORCH_VOCAB_CHUNK)
    kind = _device.device_kind()
    tile = tiles or _device_tiles(kind, hidden.element_size(), backend)
    if vocab_chunk_size is None:  # columns of the [N, chunk] gradient buffer(s) that fit DEFAULT_CHUNK_BYTES
        per_column = max(1, num_tokens) * hidden.element_size() * num_buffers
        vocab_chunk_size = max(tile.block_v, DEFAULT_CHUNK_BYTES // per_column // tile.block_v * tile.block_v)
    return _Plan(backend, 0, min(vocab, vocab_chunk_size), tile, num_cores(kind), _device.triton_interpreted())


def _flatten(hidden: torch.Tensor, weight: torch.Tensor, name: str = "hidden") -> torch.Tensor:
    if hidden.dim() < 2 or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"{name} [..., H] and its weight [V, H] disagree: {tuple(hidden.shape)} vs "
                         f"{tuple(weight.shape)}")
    if hidden.dtype != weight.dtype or not hidden.dtype.is_floating_point:
        raise TypeError(f"{name} ({hidden.dtype}) and its weight ({weight.dtype}) must share one floating dtype")
    return hidden.reshape(-1, hidden.shape[-1]).contiguous()


def _temperature(temperature, lead: torch.Size, device) -> tuple[torch.Tensor | None, float]:
    """(per-token float32 [N] or None, 1 / scalar temperature)."""
    num_tokens = lead.numel()
    if isinstance(temperature, torch.Tensor):
        temp = temperature.detach().to(device=device, dtype=torch.float32)
        temp = temp.reshape(num_tokens) if temp.numel() == num_tokens else temp.expand(lead).reshape(num_tokens)
        return temp.contiguous(), 1.0
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return None, 1.0 / float(temperature)


class _LogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, hidden, weight, targets, temperature, inv_temp):
        ctx.set_materialize_grads(False)
        out = plan.forward(hidden, weight, targets, temperature, inv_temp)
        ctx.plan, ctx.inv_temp = plan, inv_temp
        ctx.save_for_backward(hidden, weight, targets, temperature, out["lse"], out["mean_z"])
        return out["logprobs"], out["entropy"]

    @staticmethod
    def backward(ctx, g_logprobs, g_entropy):
        hidden, weight, targets, temperature, lse, mean_z = ctx.saved_tensors
        dh, dw = ctx.plan.backward(hidden, weight, targets, temperature, ctx.inv_temp, lse, mean_z, g_logprobs,
                                   g_entropy, ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        return None, dh, dw, None, None, None


class _FullVocabKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, hidden, weight, ref_hidden, ref_weight, temperature, inv_temp):
        out = plan.forward(hidden, weight, None, temperature, inv_temp, ref_hidden=ref_hidden, ref_weight=ref_weight)
        ctx.plan, ctx.inv_temp = plan, inv_temp
        ctx.save_for_backward(hidden, weight, ref_hidden, ref_weight, temperature, out["lse"], out["mean_d"])
        return out["kl"]

    @staticmethod
    def backward(ctx, g_kl):
        hidden, weight, ref_hidden, ref_weight, temperature, lse, mean_d = ctx.saved_tensors
        dh, dw = ctx.plan.backward(hidden, weight, None, temperature, ctx.inv_temp, lse, mean_d, g_kl, None,
                                   ctx.needs_input_grad[1], ctx.needs_input_grad[2], ref_hidden, ref_weight)
        return None, dh, dw, None, None, None, None


def linear_logprob_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    *,
    backend: str = "auto",
    chunk_size: int | None = None,
    vocab_chunk_size: int | None = None,
    tiles: TileConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets`` and entropy, per token, of ``softmax(hidden @ weight.T / temperature)``.

    Args:
        hidden: ``[..., H]`` last hidden states (bf16 / fp16 / fp32).
        weight: ``[V, H]`` lm_head weight, same dtype. Any ``V`` (no multiple-of-block requirement).
        targets: ``[...]`` integer token ids in ``[0, V)`` (masked positions: any valid id, then mask the output).
        temperature: a float > 0, or a tensor of per-token temperatures (``[...]`` or ``[N]``); no gradient.
        backend: ``"auto" | "torch" | "triton" | "triton_mm"`` (module docstring).
        chunk_size: tokens per block (torch backend).
        vocab_chunk_size: vocabulary columns per chunk (torch blocks; triton backward's gradient chunk).
        tiles: override the device-chosen tile (tests, tuning).

    Returns:
        ``(logprobs, entropy)``, float32, shaped like ``targets``; both differentiable w.r.t. ``hidden``, ``weight``.
    """
    lead = hidden.shape[:-1]
    if targets.shape != lead or targets.dtype.is_floating_point:
        raise ValueError(f"targets must be integer ids shaped {tuple(lead)}, "
                         f"got {targets.dtype} {tuple(targets.shape)}")
    flat = _flatten(hidden, weight)
    temp, inv_temp = _temperature(temperature, lead, flat.device)
    plan = _plan(backend, flat, weight.shape[0], chunk_size, vocab_chunk_size, tiles)
    logprobs, entropy = _LogprobEntropy.apply(plan, flat, weight.contiguous(), targets.reshape(-1).contiguous(),
                                              temp, inv_temp)
    return logprobs.view(lead), entropy.view(lead)


def full_vocab_kl(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    ref_hidden: torch.Tensor,
    ref_weight: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    *,
    backend: str = "auto",
    chunk_size: int | None = None,
    vocab_chunk_size: int | None = None,
    tiles: TileConfig | None = None,
) -> torch.Tensor:
    """Exact ``KL(pi || pi_ref)`` over the whole vocabulary, per token (float32, shaped like ``hidden[..., 0]``).

    ``pi = softmax(hidden @ weight.T / T)``, ``pi_ref = softmax(ref_hidden @ ref_weight.T / T)``; the two models may
    differ in hidden size but not in vocabulary. The reference is a constant: gradients flow to ``hidden`` and
    ``weight`` only. This is verl's ``kl_penalty="full"``, which verl leaves unimplemented.
    """
    lead = hidden.shape[:-1]
    if ref_hidden.shape[:-1] != lead or ref_weight.shape[0] != weight.shape[0]:
        raise ValueError(f"policy {tuple(hidden.shape)} x {tuple(weight.shape)} and reference "
                         f"{tuple(ref_hidden.shape)} x {tuple(ref_weight.shape)} need the same tokens and vocabulary")
    if ref_hidden.dtype != hidden.dtype:
        raise TypeError(f"reference dtype {ref_hidden.dtype} differs from the policy's {hidden.dtype}")
    flat = _flatten(hidden, weight)
    ref_flat = _flatten(ref_hidden.detach(), ref_weight.detach(), "ref_hidden")
    temp, inv_temp = _temperature(temperature, lead, flat.device)
    plan = _plan(backend, flat, weight.shape[0], chunk_size, vocab_chunk_size, tiles, num_buffers=2)
    kl = _FullVocabKL.apply(plan, flat, weight.contiguous(), ref_flat, ref_weight.detach().contiguous(), temp,
                            inv_temp)
    return kl.view(lead)
