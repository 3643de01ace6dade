"""The plain computations the fused kernels replace: full ``[N, V]`` logits, then ``log_softmax``.

Used as the oracle in tests and as the "naive" column of ``npu-rl bench kernels``. Never call them on real shapes
in training: at 16k tokens x 152k vocabulary one float32 copy of the logits is 10 GB.
"""

from __future__ import annotations

import torch


def _scaled_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature) -> torch.Tensor:
    logits = hidden @ weight.t()  # [..., V], matmul in the input dtype as a model's lm_head does
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # log-softmax in float32 (float64 stays)
    if isinstance(temperature, torch.Tensor):  # per token: [...] or [N], or broadcastable to [...]
        lead = logits.shape[:-1]
        temp = temperature.to(logits.dtype)
        temp = temp.reshape(lead) if temp.numel() == lead.numel() else temp.expand(lead)
        return logits / temp.unsqueeze(-1)
    return logits / temperature


def naive_logprob_entropy(hidden, weight, targets, temperature=1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-prob of ``targets``, entropy) per token, float32 (float64 for float64 inputs), through full logits."""
    logp = torch.log_softmax(_scaled_logits(hidden, weight, temperature), dim=-1)
    logprobs = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(dim=-1)
    return logprobs, entropy


def naive_full_vocab_kl(hidden, weight, ref_hidden, ref_weight, temperature=1.0) -> torch.Tensor:
    """KL(pi || pi_ref) per token, float32, through full logits; the reference is detached."""
    logp = torch.log_softmax(_scaled_logits(hidden, weight, temperature), dim=-1)
    with torch.no_grad():
        ref_logp = torch.log_softmax(_scaled_logits(ref_hidden, ref_weight, temperature), dim=-1)
    return (logp.exp() * (logp - ref_logp)).sum(dim=-1)
