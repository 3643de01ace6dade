"""Fused implementations of registered policy losses (``actor_rollout_ref.model.use_fused_kernels``).

``vanilla`` through :func:`npu_rl.kernels.policy_loss_and_kl`: one pass over the [B, T] tensors gives the per-token
PPO losses, the clip flags and, given the reference's log-probs, the per-token KL of ``actor.kl_loss_type``. It is
registered as vanilla's ``fused`` implementation: same signature, same metrics, same values as the plain loss (the
core's aggregation does the sums; tests/workers/test_fused_update.py compares whole updates), and its KL values go
to the KL loss term through ``LossOutput.token_kl`` instead of being computed a second time. Losses without a fused
implementation run their plain one.
"""

from __future__ import annotations

from npu_rl.core import POLICY_LOSSES, PolicyLossInputs, masked_mean
from npu_rl.core.aggregation import LossOutput
from npu_rl.kernels import BACKENDS as KERNEL_BACKENDS  # model.fused_kernel_options.impl_backend
import npu_rl.kernels



def implementation_name(backend: str) -> str:
    """The registry's implementation name for the fused kernels on ``backend`` (``fused-torch`` ...)."""
    return f"fused-{backend}"


def _fused_vanilla(backend: str):
    def fused_vanilla_policy_loss(inputs: PolicyLossInputs) -> LossOutput:
        """Dual-clip PPO (see ``npu_rl.core.policy_loss``) and, with ``inputs.ref_logprobs``, the per-token KL."""
        ref = inputs.ref_logprobs
        out = npu_rl.kernels.policy_loss_and_kl(
            inputs.logprobs, inputs.old_logprobs, inputs.advantages, ref, clip_ratio_low=inputs.clip_ratio_low,
            clip_ratio_high=inputs.clip_ratio_high, clip_ratio_c=inputs.clip_ratio_c,
            kl_type=inputs.kl_loss_type if ref is not None else "low_var_kl", weights=inputs.rollout_is_weights,
            backend=backend)
        mask = inputs.response_mask
        metrics = {"pg_clipfrac": masked_mean(out.clipped, mask).detach(),
                   "pg_clipfrac_lower": masked_mean(out.clipped_lower, mask).detach(),
                   "ppo_kl": masked_mean(-out.log_ratio, mask).detach()}
        return LossOutput(inputs.aggregate(out.pg_losses), metrics, out.kl)

    return fused_vanilla_policy_loss


for _backend in KERNEL_BACKENDS:
    POLICY_LOSSES.register_implementation("vanilla", implementation_name(_backend))(_fused_vanilla(_backend))
