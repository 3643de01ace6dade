"""The critic: a value head on an HF model (token classification with one label, as verl), and its loss for the
engine's update: the clipped value loss (``critic.cliprange_value``) aggregated with the global denominators."""

from __future__ import annotations

import torch

from npu_rl.config.derived import RunSettings
from npu_rl.config.schema import CriticConfig
from npu_rl.controller.dispatch import Dispatch, register
from npu_rl.core import value_loss
from npu_rl.models.loader import load_value_model
from npu_rl.protocol import Batch, WorkerOutput
from npu_rl.workers.engine import MicroLoss, TrainingEngine, UpdateSettings
from npu_rl.workers.model_runner import MicroBatching, sharded_load_folder


class CriticWorker:
    def __init__(self, critic_cfg: CriticConfig, run_settings: RunSettings):
        self.cfg = critic_cfg
        self.run_settings = run_settings
        self.engine: TrainingEngine | None = None

    @register(Dispatch.ALL)
    def init_model(self, total_training_steps: int) -> None:
        cfg = self.cfg
        weights_folder = sharded_load_folder(cfg.model.path)  # several ranks: built on meta, read shard by shard
        model = load_value_model(cfg.model.path, dtype=cfg.model.fsdp_config.model_dtype,
                                 override_config=dict(cfg.model.override_config),
                                 trust_remote_code=cfg.model.trust_remote_code,
                                 gradient_checkpointing=cfg.model.enable_gradient_checkpointing,
                                 device="meta" if weights_folder else None)
        update = UpdateSettings(
            rows_per_mini_batch=self.run_settings.critic.rows_per_mini_batch,
            micro=MicroBatching(self.run_settings.micro_batches.critic_update, cfg.use_dynamic_bsz,
                                cfg.ppo_max_token_len_per_gpu),
            epochs=cfg.ppo_epochs, shuffle=cfg.shuffle, grad_clip=cfg.grad_clip)
        forward_micro = MicroBatching(self.run_settings.micro_batches.critic_values, cfg.use_dynamic_bsz,
                                      cfg.forward_max_token_len_per_gpu)
        self.engine = TrainingEngine(
            model, cfg.model.fsdp_config, role="critic", response_length=self.run_settings.max_response_length,
            forward_micro=forward_micro, sp_size=cfg.ulysses_sequence_parallel_size,
            use_remove_padding=cfg.model.use_remove_padding, optim_config=cfg.optim,
            total_training_steps=total_training_steps, update=update, seed=self.run_settings.seed,
            weights_folder=weights_folder)

    def dispatch_layout(self):
        return self.engine.dispatch_layout() if self.engine is not None else None

    @register(Dispatch.DP_SPLIT)
    def compute_values(self, batch: Batch) -> Batch:
        return self.engine.infer(batch, lambda mb: {"values": self.engine.forward_values(mb)})

    @register(Dispatch.DP_SPLIT)
    def update_critic(self, batch: Batch) -> WorkerOutput:
        return WorkerOutput(metrics=self.engine.update(batch, self.micro_loss))

    def micro_loss(self, mb: Batch, denominators: dict[str, torch.Tensor]) -> MicroLoss:
        device = self.engine.device
        out = value_loss(predicted_values=self.engine.forward_values(mb), old_values=mb["values"].to(device),
                         returns=mb["returns"].to(device), response_mask=mb["response_mask"].to(device),
                         cliprange_value=self.cfg.cliprange_value, loss_agg_mode=self.cfg.loss_agg_mode,
                         global_num_tokens=denominators["global_num_tokens"],
                         global_num_seqs=denominators["global_num_seqs"],
                         loss_scale_factor=self.cfg.loss_scale_factor or self.run_settings.max_response_length)
        return MicroLoss(out.loss, {"critic/vf_clipfrac": out.metrics["vf_clipfrac"]},
                         {"critic/vf_loss": out.loss.detach()})

    @register(Dispatch.ALL)
    def save_checkpoint(self, path: str) -> None:
        self.engine.save(path, self.cfg.checkpoint.save_contents)

    @register(Dispatch.ALL)
    def load_checkpoint(self, path: str) -> None:
        self.engine.load(path, self.cfg.checkpoint.load_contents)
