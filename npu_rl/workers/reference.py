"""The reference policy: frozen log-probs for the KL term (as a loss or in the reward), on a forward-only engine."""

from __future__ import annotations

import torch

from npu_rl.config.derived import RunSettings
from npu_rl.config.schema import ModelConfig, RefConfig
from npu_rl.controller.dispatch import Dispatch, register
from npu_rl.protocol import Batch
from npu_rl.workers.actor import build_policy_engine, logprob_options
from npu_rl.workers.engine import TrainingEngine
from npu_rl.workers.model_runner import MicroBatching


class ReferenceWorker:
    def __init__(self, model_cfg: ModelConfig, ref_cfg: RefConfig, run_settings: RunSettings):
        self.model_cfg = model_cfg
        self.cfg = ref_cfg
        self.run_settings = run_settings
        self.engine: TrainingEngine | None = None

    @register(Dispatch.ALL)
    def init_model(self) -> None:
        ref = self.cfg
        micro = MicroBatching(self.run_settings.micro_batches.ref_logprob, ref.log_prob_use_dynamic_bsz,
                              ref.log_prob_max_token_len_per_gpu)
        self.engine = build_policy_engine(self.model_cfg, ref.fsdp_config, role="ref", run_settings=self.run_settings,
                                          forward_micro=micro, sp_size=ref.ulysses_sequence_parallel_size,
                                          trainable=False,
                                          compile_blocks=ref.use_torch_compile and self.run_settings.allow_compile)

    def dispatch_layout(self):
        return self.engine.dispatch_layout() if self.engine is not None else None

    @register(Dispatch.DP_SPLIT)
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        """``ref_logprobs`` [B, R] at the rollout temperature (the same temperature the actor's log-probs use)."""
        options = logprob_options(self.model_cfg, compute_entropy=False)

        def forward(mb: Batch) -> dict[str, torch.Tensor]:
            return {"ref_logprobs": self.engine.forward_logprobs(mb, self.run_settings.logprob_temperature, options)[0]}

        return self.engine.infer(batch, forward)
