"""The actor: the policy's log-probs (with entropy) and its PPO update.

update_policy, for one step's batch on this rank::

    for epoch in ppo_epochs:
        for mini-batch in batch (ppo_mini_batch_size x n / dp rows):
            N_tok, N_seq = valid tokens / sequences of the mini-batch on ALL ranks     # global denominators
            for micro-batch in mini-batch (fixed size or token budget):
                loss = policy_loss(logprobs, old_logprobs, advantages)              # its share of the mean
                       - entropy_coeff * entropy + kl_loss_coef * kl(logprobs, ref_logprobs)
                (loss * dp).backward()                                                 # FSDP averages over dp
            clip grads; skip the step (and count it) when the grad norm is not finite; optimizer.step()
    lr_scheduler.step()
"""

from __future__ import annotations

import math
import warnings

import torch

from npu_rl.config.schema import PPOConfig
from npu_rl.controller.dispatch import Dispatch, register
from npu_rl.core import (
    PolicyLossInputs,
    agg_loss,
    compute_policy_loss,
    entropy_bonus,
    kl_loss,
    loss_denominators,
    masked_mean,
)
from npu_rl.models.forward import LogprobOptions, packed_response_logprobs, response_logprobs
from npu_rl.models.loader import load_causal_lm
from npu_rl.models.lora import LoraSpec, adapter_disabled, apply_lora, is_lora_model, merged_named_weights
from npu_rl.parallel.fsdp import clip_grad_norm
from npu_rl.parallel.weights import iter_full_parameters
from npu_rl.protocol import Batch
from npu_rl.trainer.metrics import mean_of
from npu_rl.utils.lr_schedule import build_scheduler
from npu_rl.workers import distributed
from npu_rl.workers.checkpointing import load_worker_state, save_worker_state
from npu_rl.workers.model_runner import (
    MicroBatching,
    ModelRunner,
    pad_right,
    restore_order,
    split_micro_batches,
    trimmed_inputs,
)


def build_optimizer(model: torch.nn.Module, optim_config) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=optim_config.lr, betas=tuple(optim_config.betas), eps=optim_config.eps,
                             weight_decay=optim_config.weight_decay)


class LogprobModel:
    """A causal LM that computes response log-probs in micro-batches: the actor's and the reference's engine."""

    def __init__(self, config: PPOConfig, fsdp_config, micro: MicroBatching, trainable: bool, sp_size: int = 1):
        model_cfg = config.actor_rollout_ref.model
        self.config = config
        self.micro = micro
        self.response_length = config.data.max_response_length
        lora = LoraSpec.from_config(model_cfg)
        lora_on = lora.enabled and trainable
        # LoRA: the frozen base is loaded straight in the compute dtype, the adapters are fp32 (models/lora.py)
        model = load_causal_lm(
            model_cfg.path, dtype=fsdp_config.mixed_precision.param_dtype if lora_on else fsdp_config.model_dtype,
            override_config=dict(model_cfg.override_config),
            attn_implementation=model_cfg.attn_implementation, trust_remote_code=model_cfg.trust_remote_code,
            gradient_checkpointing=trainable and model_cfg.enable_gradient_checkpointing,
        )
        if lora_on:
            model = apply_lora(model, lora, base_path=model_cfg.path, seed=config.trainer.seed)
        if not trainable:
            model.requires_grad_(False)
        self.runner = ModelRunner(model, fsdp_config, trainable, sp_size, model_cfg.use_remove_padding)
        self.model = self.runner.model
        self.options = LogprobOptions(
            use_fused_kernels=model_cfg.use_fused_kernels,
            fused_backend=model_cfg.fused_kernel_options.impl_backend,
        )

    def forward(self, mb: Batch, temperature: float, compute_entropy: bool):
        inputs, kept = trimmed_inputs(mb, self.response_length)
        options = LogprobOptions(compute_entropy, self.options.use_fused_kernels, self.options.fused_backend)
        device = self.runner.device
        args = (self.runner.compute_model, inputs["input_ids"].to(device), inputs["attention_mask"].to(device),
                inputs["position_ids"].to(device), inputs["responses"].to(device), temperature, options)
        if self.runner.packed:
            logprobs, entropy = packed_response_logprobs(*args, sp_group=self.runner.sp_group)
        else:
            logprobs, entropy = response_logprobs(*args)
        logprobs = pad_right(logprobs, self.response_length)
        entropy = pad_right(entropy, self.response_length) if entropy is not None else None
        return logprobs, entropy

    @torch.no_grad()
    def logprobs(self, batch: Batch, temperature: float, compute_entropy: bool) -> Batch:
        self.runner.eval()
        micro_batches, permutation = split_micro_batches(batch, self.micro)
        logprobs, entropies = [], []
        for mb in micro_batches:
            lp, ent = self.forward(mb, temperature, compute_entropy)
            logprobs.append(lp.cpu())
            if ent is not None:
                entropies.append(ent.cpu())
        out = Batch({"logprobs": restore_order(logprobs, permutation)})
        if compute_entropy:
            out["entropy"] = restore_order(entropies, permutation)
        return out


class ActorWorker:
    """The policy being trained (one role; the rollout engine and the reference are separate workers)."""

    def __init__(self, config: PPOConfig):
        self.config = config
        self.actor_cfg = config.actor_rollout_ref.actor
        self.engine: LogprobModel | None = None

    # ------------------------------------------------------------------------------------------- set-up
    @register(Dispatch.ALL)
    def init_model(self, total_training_steps: int) -> None:
        distributed.init()
        rollout = self.config.actor_rollout_ref.rollout
        micro = MicroBatching(rollout.log_prob_micro_batch_size_per_gpu, rollout.log_prob_use_dynamic_bsz,
                              rollout.log_prob_max_token_len_per_gpu)
        self.engine = LogprobModel(self.config, self.actor_cfg.fsdp_config, micro, trainable=True,
                                   sp_size=self.actor_cfg.ulysses_sequence_parallel_size)
        self.model = self.engine.model
        self.optimizer = build_optimizer(self.model, self.actor_cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, self.actor_cfg.optim, total_training_steps)
        self.update_micro = MicroBatching(self.actor_cfg.ppo_micro_batch_size_per_gpu, self.actor_cfg.use_dynamic_bsz,
                                          self.actor_cfg.ppo_max_token_len_per_gpu)
        self.num_updates = 0

    @register(Dispatch.RANK0)
    def model_config(self):
        return self.model.config

    @property
    def is_lora(self) -> bool:
        return is_lora_model(self.model)

    def dispatch_layout(self):
        return self.engine.runner.dispatch_layout() if self.engine is not None else None

    # ------------------------------------------------------------------------------------------- log-probs
    @register(Dispatch.DP_SPLIT)
    def compute_logprobs(self, batch: Batch) -> Batch:
        """``old_logprobs`` [B, R] and ``entropy`` [B, R] at the rollout temperature."""
        out = self.engine.logprobs(batch, self.config.actor_rollout_ref.rollout.temperature, compute_entropy=True)
        return Batch({"old_logprobs": out["logprobs"], "entropy": out["entropy"]})

    @register(Dispatch.DP_SPLIT)
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        """With LoRA, the reference policy is this model with its adapter off: ``ref_logprobs`` [B, R] without a
        second copy of the weights."""
        with adapter_disabled(self.engine.runner.compute_model):
            out = self.engine.logprobs(batch, self.config.actor_rollout_ref.rollout.temperature,
                                       compute_entropy=False)
        return Batch({"ref_logprobs": out["logprobs"]})

    # ------------------------------------------------------------------------------------------- update
    @register(Dispatch.DP_SPLIT)
    def update_policy(self, batch: Batch) -> dict[str, float]:
        """PPO update over ``batch`` (this rank's rows); returns metrics averaged over mini-batches."""
        cfg = self.actor_cfg
        self.engine.runner.train()
        dp = self.engine.runner.dp_size
        rows_per_mini = cfg.ppo_mini_batch_size * self.config.actor_rollout_ref.rollout.n // dp
        metrics: list[dict[str, torch.Tensor]] = []
        generator = torch.Generator().manual_seed(self.config.trainer.seed + self.num_updates)
        for _ in range(cfg.ppo_epochs):
            order = torch.randperm(len(batch), generator=generator) if cfg.shuffle else torch.arange(len(batch))
            for mini in batch.index(order).split(rows_per_mini):
                metrics.append(self._update_mini_batch(mini, dp))
        with warnings.catch_warnings():  # every update skipped (non-finite): the schedule still advances
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
            self.scheduler.step()
        self.num_updates += 1
        out = mean_of(metrics)
        out["actor/lr"] = torch.tensor(self.scheduler.get_last_lr()[0])
        out["actor/nan_skipped"] = torch.stack([m["actor/nan_skipped"] for m in metrics]).sum()
        return {k: float(v) for k, v in out.items()}

    def _update_mini_batch(self, mini: Batch, dp: int) -> dict[str, torch.Tensor]:
        cfg = self.actor_cfg
        denominators = distributed.all_reduce_sum(loss_denominators(mini["response_mask"]),
                                                  self.engine.runner.dp_group)
        micro_batches, _ = split_micro_batches(mini, self.update_micro)
        runner = self.engine.runner
        self.optimizer.zero_grad(set_to_none=True)
        micro_metrics = []
        for mb in micro_batches:
            loss, m = self._micro_loss(mb, denominators)
            (loss * dp).backward()
            runner.grads_to_master()
            micro_metrics.append(m)
        grad_norm = clip_grad_norm(self.model, cfg.grad_clip)
        finite = math.isfinite(float(grad_norm))  # one host sync per mini-batch, to decide on the step
        if finite:
            runner.optimizer_step(self.optimizer)
        else:
            self.optimizer.zero_grad(set_to_none=True)
        # pg_loss: the micro-batches' shares add up to this rank's part of the mini-batch mean; times dp it is this
        # rank's estimate of the mean, so the average over ranks (what the trainer logs) is the mini-batch's mean.
        out = {k: torch.stack([m[k] for m in micro_metrics]).mean() for k in micro_metrics[0]}
        out["actor/pg_loss"] = torch.stack([m["actor/pg_loss"] for m in micro_metrics]).sum() * dp
        out["actor/grad_norm"] = grad_norm.detach().float()
        out["actor/nan_skipped"] = torch.tensor(0.0 if finite else 1.0)
        return out

    def _micro_loss(self, mb: Batch, denominators: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        cfg = self.actor_cfg
        device = self.engine.runner.device
        need_entropy = cfg.entropy_coeff != 0
        logprobs, entropy = self.engine.forward(mb, self.config.actor_rollout_ref.rollout.temperature, need_entropy)
        response_mask = mb["response_mask"].to(device)
        agg = dict(loss_agg_mode=cfg.loss_agg_mode, global_num_tokens=denominators["global_num_tokens"].to(device),
                   global_num_seqs=denominators["global_num_seqs"].to(device),
                   loss_scale_factor=self.config.data.max_response_length)
        pl = cfg.policy_loss
        if self.engine.options.use_fused_kernels and pl.loss_mode == "vanilla":
            return self._fused_micro_loss(mb, logprobs, entropy, response_mask, agg)
        inputs = PolicyLossInputs(
            old_logprobs=mb["old_logprobs"].to(device), logprobs=logprobs, advantages=mb["advantages"].to(device),
            response_mask=response_mask,
            clip_ratio_low=cfg.clip_ratio if cfg.clip_ratio_low is None else cfg.clip_ratio_low,
            clip_ratio_high=cfg.clip_ratio if cfg.clip_ratio_high is None else cfg.clip_ratio_high,
            clip_ratio_c=cfg.clip_ratio_c, clip_cov_ratio=pl.clip_cov_ratio, clip_cov_lb=pl.clip_cov_lb,
            clip_cov_ub=pl.clip_cov_ub, kl_cov_ratio=pl.kl_cov_ratio, ppo_kl_coef=pl.ppo_kl_coef, **agg)
        policy = compute_policy_loss(loss_mode=pl.loss_mode, inputs=inputs)
        loss = policy.loss
        metrics = {f"actor/{k}": v for k, v in policy.metrics.items()}
        metrics["actor/pg_loss"] = policy.loss.detach()
        if need_entropy:
            bonus = entropy_bonus(entropy=entropy, response_mask=response_mask, entropy_coeff=cfg.entropy_coeff, **agg)
            loss = loss + bonus.loss
        if cfg.use_kl_loss:
            kl = kl_loss(logprobs=logprobs, ref_logprobs=mb["ref_logprobs"].to(device), response_mask=response_mask,
                         kl_loss_coef=cfg.kl_loss_coef, kl_type=cfg.kl_loss_type, **agg)
            loss = loss + kl.loss
            metrics["actor/kl_loss"] = kl.metrics["kl_loss"]
            metrics["actor/kl_coef"] = torch.tensor(cfg.kl_loss_coef)
        return loss, metrics

    def _fused_micro_loss(self, mb: Batch, logprobs, entropy, response_mask, agg) -> tuple[torch.Tensor, dict]:
        """Vanilla PPO + KL loss through one fused kernel (``model.use_fused_kernels``): the [B, T] inputs are read
        once and per-token losses, KL and clip flags come out together; aggregation is the core's, so the result
        equals the unfused path (tests/trainer/test_fused_update.py)."""
        import npu_rl_kernels

        cfg = self.actor_cfg
        device = self.engine.runner.device
        ref = mb["ref_logprobs"].to(device) if cfg.use_kl_loss else None
        out = npu_rl_kernels.policy_loss_and_kl(
            logprobs, mb["old_logprobs"].to(device), mb["advantages"].to(device), ref,
            clip_ratio_low=cfg.clip_ratio if cfg.clip_ratio_low is None else cfg.clip_ratio_low,
            clip_ratio_high=cfg.clip_ratio if cfg.clip_ratio_high is None else cfg.clip_ratio_high,
            clip_ratio_c=cfg.clip_ratio_c, kl_type=cfg.kl_loss_type if ref is not None else "low_var_kl",
            backend=self.engine.options.fused_backend)
        mask = response_mask.bool()
        loss = agg_loss(loss_mat=out.pg_losses, loss_mask=response_mask, **agg)
        metrics = {"actor/pg_clipfrac": masked_mean(out.clipped, mask),
                   "actor/pg_clipfrac_lower": masked_mean(out.clipped_lower, mask),
                   "actor/ppo_kl": masked_mean(-out.log_ratio, mask), "actor/pg_loss": loss.detach()}
        if cfg.entropy_coeff != 0:
            loss = loss + entropy_bonus(entropy=entropy, response_mask=response_mask,
                                        entropy_coeff=cfg.entropy_coeff, **agg).loss
        if ref is not None:
            loss = loss + cfg.kl_loss_coef * agg_loss(loss_mat=out.kl, loss_mask=response_mask, **agg)
            metrics["actor/kl_loss"] = masked_mean(out.kl, mask).detach()
            metrics["actor/kl_coef"] = torch.tensor(cfg.kl_loss_coef)
        return loss, metrics

    # ------------------------------------------------------------------------------------------- checkpoints
    @register(Dispatch.ALL)
    def save_checkpoint(self, path: str, tokenizer=None) -> None:
        save_worker_state(path, self.model, self.optimizer, self.scheduler, self.actor_cfg.checkpoint.save_contents,
                          tokenizer, base_path=self.config.actor_rollout_ref.model.path)

    @register(Dispatch.ALL)
    def load_checkpoint(self, path: str) -> None:
        load_worker_state(path, self.model, self.optimizer, self.scheduler, self.actor_cfg.checkpoint.load_contents)
        self.engine.runner.master_to_compute()
        self.num_updates = self.scheduler.last_epoch

    # ------------------------------------------------------------------------------------------- weights
    @property
    def generation_module(self) -> torch.nn.Module:
        """The module an in-process (hf) rollout engine generates with: the compute copy."""
        return self.engine.runner.compute_model

    def named_full_weights(self):
        """(HF name, full tensor) one at a time, for the rollout engine (gathered from shards when sharded)."""
        if self.is_lora:  # an engine that takes plain weights gets W + scale * B @ A
            return merged_named_weights(self.model)
        return iter_full_parameters(self.model)
