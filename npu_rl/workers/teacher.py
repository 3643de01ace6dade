"""The on-policy distillation teacher (``distillation.*``): a frozen causal LM scoring the student's sampled tokens.

It is the reference's machinery (:class:`~npu_rl.workers.reference.ReferenceWorker`: a forward-only engine,
sharded with FSDP2 over the ranks of its group (the trainer's devices, or the teacher pool's with
``distillation.nnodes >= 1``), micro-batched with ``actor_rollout_ref.ref``'s log-prob settings) on another model
folder, with its own FSDP settings (dtype, offload: ``distillation.teacher_models.<name>.fsdp_config``). Several
teachers are several of these workers; npu_rl/trainer/teachers.py routes the rows. Its log-probs are taken at temperature 1, as verl's
teacher server computes them (``prompt_logprobs`` at temperature 1.0 whatever the rollout's). The student's token
ids are scored as they are, so the teacher shares the student's tokenizer (checked at validation:
npu_rl/trainer/checks/distillation.py). With ``loss_mode=forward_kl_topk`` the same forward also gives the teacher's
top-k per position (``teacher_topk_logprobs`` / ``teacher_topk_ids`` [B, R, K], K = ``distillation_loss.topk``), the
top-k of its logits as verl's teacher server returns them (``prompt_logprobs=k``).
"""

from __future__ import annotations

import dataclasses

import torch

from npu_rl.config.distillation_schema import DistillationTeacherConfig
from npu_rl.config.schema import ModelConfig, RefConfig
from npu_rl.controller.dispatch import Dispatch, register
from npu_rl.protocol import Batch
from npu_rl.workers.actor import logprob_options
from npu_rl.workers.reference import ReferenceWorker

TEACHER_TEMPERATURE = 1.0


def teacher_slices(model_cfg: ModelConfig, ref_cfg: RefConfig, teacher: DistillationTeacherConfig
                   ) -> tuple[ModelConfig, RefConfig]:
    """The teacher's model and forward settings: the actor's model settings (remove-padding, fused kernels,
    attention) on the teacher's folder, without LoRA or the actor's config overrides or gradient checkpointing; the
    reference's micro-batching with the teacher's FSDP settings."""
    model = dataclasses.replace(model_cfg, path=teacher.model_path, override_config={}, lora_rank=0,
                                lora_adapter_path=None, enable_gradient_checkpointing=False)
    return model, dataclasses.replace(ref_cfg, fsdp_config=teacher.fsdp_config, use_torch_compile=False)


class TeacherWorker(ReferenceWorker):
    ROLE = "teacher"
    OUTPUT = "teacher_logprobs"

    @property
    def temperature(self) -> float:
        return TEACHER_TEMPERATURE

    @register(Dispatch.DP_SPLIT, pad_rows=True)
    def compute_teacher_logprobs(self, batch: Batch) -> Batch:
        """``teacher_logprobs`` [B, R]: the teacher's log-probs of the student's response tokens; with the top-k loss
        also ``teacher_topk_logprobs`` and ``teacher_topk_ids`` [B, R, K]."""
        spec = self.run_settings.distillation
        if spec is None or not spec.uses_topk:
            return self.logprobs(batch)
        options = logprob_options(self.model_cfg, compute_entropy=False)
        options.topk = spec.topk

        def forward(mb: Batch) -> dict[str, torch.Tensor]:
            stats, _ = self.engine.forward_logprob_stats(mb, self.temperature, options)
            return {self.OUTPUT: stats["logprobs"], "teacher_topk_logprobs": stats["topk_logprobs"],
                    "teacher_topk_ids": stats["topk_ids"]}

        return self.engine.infer(batch, forward)
