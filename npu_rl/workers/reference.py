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
    """A frozen causal LM's log-probs of the sampled response tokens, on a forward-only engine: the reference (below)
    and the distillation teacher (npu_rl/workers/teacher.py) differ only in their model and these three names."""

    ROLE = "ref"  # the engine's role (metric prefixes, profiler)
    OUTPUT = "ref_logprobs"

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
        self.engine = build_policy_engine(self.model_cfg, ref.fsdp_config, role=self.ROLE, run_settings=self.run_settings,
                                          forward_micro=micro, sp_size=ref.ulysses_sequence_parallel_size,
                                          trainable=False,
                                          compile_blocks=ref.use_torch_compile and self.run_settings.allow_compile)

    def dispatch_layout(self):
        return self.engine.dispatch_layout() if self.engine is not None else None

    @property
    def temperature(self) -> float:
        """The reference's: the rollout temperature (the same temperature the actor's log-probs use)."""
        return self.run_settings.logprob_temperature

    def logprobs(self, batch: Batch) -> Batch:
        """``{OUTPUT: [B, R]}``: this model's log-probs of the response tokens at :attr:`temperature`."""
        options = logprob_options(self.model_cfg, compute_entropy=False)

        def forward(mb: Batch) -> dict[str, torch.Tensor]:
            return {self.OUTPUT: self.engine.forward_logprobs(mb, self.temperature, options)[0]}

        return self.engine.infer(batch, forward)

    @register(Dispatch.DP_SPLIT)
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        """``ref_logprobs`` [B, R] at the rollout temperature."""
        return self.logprobs(batch)
