"""The critic: a value head on an HF model (token classification with one label, as verl), and its update.

update_critic mirrors the actor's update: mini-batches x ppo_epochs, micro-batches or token budget, the clipped
value loss with global denominators, grad clipping, non-finite steps skipped and counted.
"""

from __future__ import annotations

import math

import torch

from npu_rl.config.schema import PPOConfig
from npu_rl.controller.dispatch import Dispatch, register
from npu_rl.core import loss_denominators, value_loss
from npu_rl.models.forward import packed_response_values, response_values
from npu_rl.models.loader import load_value_model
from npu_rl.parallel.fsdp import clip_grad_norm
from npu_rl.protocol import Batch
from npu_rl.trainer.metrics import mean_of
from npu_rl.utils.lr_schedule import build_scheduler
from npu_rl.workers import distributed
from npu_rl.workers.actor import build_optimizer
from npu_rl.workers.checkpointing import load_worker_state, save_worker_state
from npu_rl.workers.model_runner import (
    MicroBatching,
    ModelRunner,
    pad_right,
    restore_order,
    split_micro_batches,
    trimmed_inputs,
)


class CriticWorker:
    def __init__(self, config: PPOConfig):
        self.config = config
        self.critic_cfg = config.critic

    @register(Dispatch.ALL)
    def init_model(self, total_training_steps: int) -> None:
        cfg = self.critic_cfg
        distributed.init()
        model = load_value_model(cfg.model.path, dtype=cfg.model.fsdp_config.model_dtype,
                                 override_config=dict(cfg.model.override_config),
                                 trust_remote_code=cfg.model.trust_remote_code,
                                 gradient_checkpointing=cfg.model.enable_gradient_checkpointing)
        self.runner = ModelRunner(model, cfg.model.fsdp_config, trainable=True,
                                  sp_size=cfg.ulysses_sequence_parallel_size,
                                  use_remove_padding=cfg.model.use_remove_padding)
        self.model = self.runner.model
        self.optimizer = build_optimizer(self.model, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, total_training_steps)
        self.forward_micro = MicroBatching(cfg.forward_micro_batch_size_per_gpu, cfg.use_dynamic_bsz,
                                           cfg.forward_max_token_len_per_gpu)
        self.update_micro = MicroBatching(cfg.ppo_micro_batch_size_per_gpu, cfg.use_dynamic_bsz,
                                          cfg.ppo_max_token_len_per_gpu)
        self.response_length = self.config.data.max_response_length

    def dispatch_layout(self):
        return self.runner.dispatch_layout() if hasattr(self, "runner") else None

    def _values(self, mb: Batch) -> torch.Tensor:
        inputs, kept = trimmed_inputs(mb, self.response_length)
        device = self.runner.device
        args = (self.runner.compute_model, inputs["input_ids"].to(device), inputs["attention_mask"].to(device),
                inputs["position_ids"].to(device), kept)
        if self.runner.packed:
            values = packed_response_values(*args, sp_group=self.runner.sp_group)
        else:
            values = response_values(*args)
        return pad_right(values, self.response_length) * mb["response_mask"].to(device)

    @register(Dispatch.DP_SPLIT)
    @torch.no_grad()
    def compute_values(self, batch: Batch) -> Batch:
        self.runner.eval()
        micro_batches, permutation = split_micro_batches(batch, self.forward_micro)
        values = [self._values(mb).cpu() for mb in micro_batches]
        return Batch({"values": restore_order(values, permutation)})

    @register(Dispatch.DP_SPLIT)
    def update_critic(self, batch: Batch) -> dict[str, float]:
        cfg = self.critic_cfg
        self.runner.train()
        dp = self.runner.dp_size
        rows_per_mini = cfg.ppo_mini_batch_size * self.config.actor_rollout_ref.rollout.n // dp
        metrics = []
        for _ in range(cfg.ppo_epochs):
            for mini in batch.split(rows_per_mini):
                metrics.append(self._update_mini_batch(mini, dp))
        self.scheduler.step()
        out = mean_of(metrics)
        out["critic/lr"] = torch.tensor(self.scheduler.get_last_lr()[0])
        return {k: float(v) for k, v in out.items()}

    def _update_mini_batch(self, mini: Batch, dp: int) -> dict[str, torch.Tensor]:
        cfg = self.critic_cfg
        device = self.runner.device
        denominators = distributed.all_reduce_sum(loss_denominators(mini["response_mask"]), self.runner.dp_group)
        micro_batches, _ = split_micro_batches(mini, self.update_micro)
        self.optimizer.zero_grad(set_to_none=True)
        losses, clipfracs = [], []
        for mb in micro_batches:
            out = value_loss(predicted_values=self._values(mb), old_values=mb["values"].to(device),
                             returns=mb["returns"].to(device), response_mask=mb["response_mask"].to(device),
                             cliprange_value=cfg.cliprange_value, loss_agg_mode=cfg.loss_agg_mode,
                             global_num_tokens=denominators["global_num_tokens"].to(device),
                             global_num_seqs=denominators["global_num_seqs"].to(device),
                             loss_scale_factor=self.config.critic.loss_scale_factor or self.response_length)
            (out.loss * dp).backward()
            self.runner.grads_to_master()
            losses.append(out.loss.detach())
            clipfracs.append(out.metrics["vf_clipfrac"])
        grad_norm = clip_grad_norm(self.model, cfg.grad_clip)
        finite = math.isfinite(float(grad_norm))
        if finite:
            self.runner.optimizer_step(self.optimizer)
        else:
            self.optimizer.zero_grad(set_to_none=True)
        # vf_loss like the actor's pg_loss: this rank's estimate of the mini-batch mean (ranks average to it)
        return {"critic/vf_loss": torch.stack(losses).sum() * dp, "critic/vf_clipfrac": torch.stack(clipfracs).mean(),
                "critic/grad_norm": grad_norm.detach().float(), "critic/nan_skipped": torch.tensor(float(not finite))}

    @register(Dispatch.ALL)
    def save_checkpoint(self, path: str) -> None:
        save_worker_state(path, self.model, self.optimizer, self.scheduler, self.critic_cfg.checkpoint.save_contents)

    @register(Dispatch.ALL)
    def load_checkpoint(self, path: str) -> None:
        load_worker_state(path, self.model, self.optimizer, self.scheduler, self.critic_cfg.checkpoint.load_contents)
        self.runner.master_to_compute()
