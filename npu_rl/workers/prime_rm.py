"""PRIME's implicit process reward model (``reward_model.reward_manager=prime`` with ``reward_model.enable``).

A trainable causal LM (``reward_model.model.path``, usually the policy's own folder) and its frozen reference
(``reward_model.model.ref_path``, default the same folder), both on the trainer's devices. Per step (verl-recipe's
prime_dp_rm.py / prime_fsdp_workers.py; the formulas are in :mod:`npu_rl.core.prime`):

- ``update_rm``: the reference's log-probs of the response tokens, then optimizer steps of the PRM over the batch in
  mini-batches of ``reward_model.mini_batch_size`` samples (micro-batches of ``reward_model.micro_batch_size_per_gpu``)
  with the cross-entropy of ``sigmoid(beta_train x sum_t log-ratio)`` against the outcome ``acc``;
- ``compute_rm_score``: the PRM's token scores ``rm_scores`` [B, R] and ``reward_model/*`` metrics.

Log-probs are taken at temperature 1 (the raw logits, as verl's PRM). The PRM trains with the actor's FSDP settings
(``actor_rollout_ref.actor.fsdp_config``: verl's prime_trainer.yaml ties its offload keys to the actor's) and the
optimizer ``reward_model.model.optim``; its reference runs with the same settings (the same dtypes), so that the two
agree exactly before the first update (``q = 0``; verl's reference runs under bf16 autocast, whose rounding the batch
normalisation would blow up to rewards of order 1). Its checkpoint (weights, optimizer, schedule) is the folder
``reward_model/`` of each step's checkpoint.
"""

from __future__ import annotations

import dataclasses

import torch

from npu_rl.config.derived import RunSettings
from npu_rl.config.reward_schema import RewardModelConfig
from npu_rl.config.schema import ActorRolloutRefConfig
from npu_rl.controller.dispatch import Dispatch, register
from npu_rl.core.prime import (
    dpo_abs_accuracy,
    dpo_accuracy,
    implicit_log_ratio,
    implicit_prm_ce_loss,
    implicit_token_scores,
)
from npu_rl.core.groups import as_group_ids
from npu_rl.protocol import Batch, WorkerOutput
from npu_rl.workers.actor import build_policy_engine, logprob_options
from npu_rl.workers.engine import MicroLoss, TrainingEngine, UpdateSettings
from npu_rl.workers.model_runner import MicroBatching

PRM_TEMPERATURE = 1.0
ROLE = "reward_model"  # the engine's metric prefix: reward_model/grad_norm, reward_model/lr (verl's names)


class ImplicitPRMWorker:
    def __init__(self, arr: ActorRolloutRefConfig, rm_cfg: RewardModelConfig, run_settings: RunSettings):
        self.cfg = rm_cfg
        self.run_settings = run_settings
        self.spec = run_settings.prime
        base = dataclasses.replace(arr.model, override_config={}, lora_rank=0, lora_adapter_path=None)
        self.prm_model = dataclasses.replace(base, path=rm_cfg.model.path,
                                             enable_gradient_checkpointing=rm_cfg.model.enable_gradient_checkpointing)
        self.ref_model = dataclasses.replace(base, path=rm_cfg.model.ref_path or rm_cfg.model.path,
                                             enable_gradient_checkpointing=False)
        self.fsdp_config = arr.actor.fsdp_config
        self.engine: TrainingEngine | None = None
        self.ref_engine: TrainingEngine | None = None

    @register(Dispatch.ALL)
    def init_model(self, total_training_steps: int) -> None:
        settings = self.run_settings
        micro = MicroBatching(settings.micro_batches.reward_model)
        dp = settings.actor.dp_size
        rows = max((self.cfg.mini_batch_size or settings.train_rows) // dp, 1)
        update = UpdateSettings(rows_per_mini_batch=rows, micro=micro, epochs=1, shuffle=False,
                                grad_clip=self.cfg.model.optim.grad_clip)
        self.engine = build_policy_engine(self.prm_model, self.fsdp_config, role=ROLE, run_settings=settings,
                                          forward_micro=micro, sp_size=1, trainable=True,
                                          optim_config=self.cfg.model.optim, total_training_steps=total_training_steps,
                                          update=update)
        self.ref_engine = build_policy_engine(self.ref_model, self.fsdp_config, role="prm_ref", run_settings=settings,
                                              forward_micro=micro, sp_size=1, trainable=False)

    def dispatch_layout(self):
        return self.engine.dispatch_layout() if self.engine is not None else None

    def _logprobs(self, engine: TrainingEngine, mb: Batch) -> torch.Tensor:
        return engine.forward_logprobs(mb, PRM_TEMPERATURE, logprob_options(self.prm_model, compute_entropy=False))[0]

    def _with_ref(self, batch: Batch) -> Batch:
        if "prm_ref_logprobs" in batch:
            return batch
        ref = self.ref_engine.infer(batch, lambda mb: {"prm_ref_logprobs": self._logprobs(self.ref_engine, mb)})
        return batch.union(ref)

    @register(Dispatch.DP_SPLIT)
    def update_rm(self, batch: Batch) -> WorkerOutput:
        """Optimizer steps of the PRM on the CE loss against ``acc``; ``reward_model/{dpo_loss,grad_norm,lr}`` and
        ``reward_model/nan_skipped`` (mini-batches whose gradient was not finite: their step is skipped)."""
        return WorkerOutput(metrics=self.engine.update(self._with_ref(batch), self.micro_loss))

    def micro_loss(self, mb: Batch, denominators: dict[str, torch.Tensor]) -> MicroLoss:
        device = self.engine.device
        mask = mb["response_mask"].to(device)
        q = implicit_log_ratio(rm_logprobs=self._logprobs(self.engine, mb),
                               ref_logprobs=mb["prm_ref_logprobs"].to(device), response_mask=mask)
        ce = implicit_prm_ce_loss(q, mb["acc"].to(device), mask, beta=self.spec.beta)
        # the micro-batch's share of the mini-batch mean (verl: loss / gradient_accumulation)
        share = ce * len(mb) / denominators["global_num_seqs"].clamp(min=1)
        return MicroLoss(share, {f"{ROLE}/dpo_loss": ce.detach()}, {})

    @register(Dispatch.DP_SPLIT)
    def compute_rm_score(self, batch: Batch) -> WorkerOutput:
        """``rm_scores`` [B, R] (normalised over this rank's rows, as verl's per-worker batch) and the metrics
        ``reward_model/{reward,raw_reward,dpo_acc,dpo_acc_abs}``."""
        batch = self._with_ref(batch)
        out = self.engine.infer(batch, lambda mb: {"prm_logprobs": self._logprobs(self.engine, mb)})
        mask = batch["response_mask"]
        q = implicit_log_ratio(rm_logprobs=out["prm_logprobs"], ref_logprobs=batch["prm_ref_logprobs"],
                               response_mask=mask)
        scores = implicit_token_scores(q, mask, beta=self.spec.beta, granularity=self.spec.granularity,
                                       norm=self.spec.norm)
        acc = batch["acc"]
        groups = as_group_ids(batch["uid"], num_samples=len(batch))
        metrics = {f"{ROLE}/reward": float(scores.sum(-1).mean()), f"{ROLE}/raw_reward": float(q.sum(-1).mean()),
                   f"{ROLE}/dpo_acc": float(dpo_accuracy(scores, acc, mask, groups)),
                   f"{ROLE}/dpo_acc_abs": float(dpo_abs_accuracy(scores, acc, mask))}
        return WorkerOutput(batch=Batch({"rm_scores": scores}), metrics=metrics)

    @register(Dispatch.ALL)
    def save_checkpoint(self, path: str) -> None:
        self.engine.save(path, ("model", "optimizer", "extra"))

    @register(Dispatch.ALL)
    def load_checkpoint(self, path: str) -> None:
        self.engine.load(path, ("model", "optimizer", "extra"))
