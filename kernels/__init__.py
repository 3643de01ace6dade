"""npu_rl.kernels: fused kernels for RL post-training.

Public API:

- :func:`linear_logprob_entropy` (hidden, lm_head weight, targets, temperature) -> (log-probs, entropy) per token,
  forward and backward, never holding ``[N, V]`` logits;
- :func:`full_vocab_kl` (policy and reference hidden states + lm_head weights) -> exact KL(pi || pi_ref) per token;
- :func:`policy_loss_and_kl` the PPO dual-clip policy loss, the KL estimator and the clip flags per token, in one pass
  over the ``[B, T]`` tensors; :func:`kl_estimate` the KL estimators alone (k1 / abs / k2 / k3, ``+`` variants);
- :func:`select_tiles` the device-budgeted tile choice (:mod:`npu_rl.kernels.tiles`);
- :mod:`npu_rl.kernels.moe_combine` the top-k combine of a mixture-of-experts layer (the compiled experts use it);
- :mod:`npu_rl.commands.bench_kernels` ``main(argv)``: ``npu-rl bench kernels``.

Each op has a chunked torch implementation (the CPU / NPU fallback) and a Triton one (CUDA; Ascend through
triton-ascend), both tested against the plain full-logits computation in kernels/plain.py; the implementation is
chosen by ``backend`` (one of :data:`BACKENDS`: auto, torch, triton, triton_mm) through the device layer.
"""

from npu_rl.kernels._device import BACKENDS
from npu_rl.kernels.linear_ops import full_vocab_kl, linear_logprob_entropy
from npu_rl.kernels.policy_kl import KL_TYPES, PolicyKLOutput, kl_estimate, policy_loss_and_kl
from npu_rl.kernels.tiles import TileConfig, select_tiles

__all__ = [
    "BACKENDS",
    "KL_TYPES",
    "PolicyKLOutput",
    "TileConfig",
    "full_vocab_kl",
    "kl_estimate",
    "linear_logprob_entropy",
    "policy_loss_and_kl",
    "select_tiles",
]
