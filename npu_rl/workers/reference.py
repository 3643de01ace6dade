"""The reference policy: frozen log-probs for the KL term (as a loss or in the reward)."""

from __future__ import annotations

from npu_rl.config.schema import PPOConfig
from npu_rl.controller.dispatch import Dispatch, register
from npu_rl.protocol import Batch
from npu_rl.workers import distributed
from npu_rl.workers.actor import LogprobModel
from npu_rl.workers.model_runner import MicroBatching


class ReferenceWorker:
    def __init__(self, config: PPOConfig):
        self.config = config
        self.engine: LogprobModel | None = None

    @register(Dispatch.ALL)
    def init_model(self) -> None:
        ref = self.config.actor_rollout_ref.ref
        distributed.init()
        micro = MicroBatching(ref.log_prob_micro_batch_size_per_gpu, ref.log_prob_use_dynamic_bsz,
                              ref.log_prob_max_token_len_per_gpu)
        self.engine = LogprobModel(self.config, ref.fsdp_config, micro, trainable=False,
                                   sp_size=ref.ulysses_sequence_parallel_size)

    def dispatch_layout(self):
        return self.engine.runner.dispatch_layout() if self.engine is not None else None

    @register(Dispatch.DP_SPLIT)
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        """``ref_logprobs`` [B, R] at the rollout temperature (the same temperature the actor's log-probs use)."""
        out = self.engine.logprobs(batch, self.config.actor_rollout_ref.rollout.temperature, compute_entropy=False)
        return Batch({"ref_logprobs": out["logprobs"]})
