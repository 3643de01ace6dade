"""The actor: the policy's log-probs (with entropy), and its loss for the engine's update.

Loss of one micro-batch (aggregated with the mini-batch's global denominators)::

    policy_loss(logprobs, old_logprobs, advantages)   # the registry's loss, fused implementation when asked
    - entropy_coeff * entropy                          # when entropy_coeff != 0
    + kl_loss_coef * kl(logprobs, ref_logprobs)        # when use_kl_loss
"""

from __future__ import annotations

import torch

from npu_rl.config.derived import RunPlan
from npu_rl.config.schema import ActorConfig, ModelConfig
from npu_rl.controller.dispatch import Dispatch, register
from npu_rl.core import PolicyLossInputs, compute_policy_loss, entropy_bonus, kl_loss, resolved_clip_ratios
from npu_rl.models.forward import LogprobOptions
from npu_rl.models.fused_losses import implementation_name
from npu_rl.models.loader import load_causal_lm
from npu_rl.models.lora import (
    ADAPTER_NAME,
    LoraSpec,
    adapter_disabled,
    adapter_tensors,
    apply_lora,
    is_lora_model,
    merged_named_weights,
)
from npu_rl.parallel.weights import iter_full_parameters
from npu_rl.protocol import Batch, WorkerOutput
from npu_rl.rollout.vllm_lora import peft_config_dict
from npu_rl.workers.engine import MicroLoss, TrainingEngine, UpdateSettings
from npu_rl.workers.model_runner import MicroBatching, sharded_load_folder


def build_policy_engine(model_cfg: ModelConfig, fsdp_config, *, role: str, plan: RunPlan, forward_micro: MicroBatching,
                        sp_size: int, trainable: bool, optim_config=None, total_training_steps=None,
                        update: UpdateSettings | None = None, compile_blocks: bool = False) -> TrainingEngine:
    """A causal LM from ``actor_rollout_ref.model`` on an engine: the actor's (trained) or the reference's.
    With ``lora_rank`` > 0 the trained one is a PEFT model: the frozen base loaded straight in the compute dtype,
    fp32 adapters (models/lora.py). On several ranks the model is built on the meta device and each rank reads
    only its shards (:func:`sharded_load_folder`)."""
    lora = LoraSpec.from_config(model_cfg)
    lora_on = lora.enabled and trainable
    weights_folder = sharded_load_folder(model_cfg.path)
    model = load_causal_lm(
        model_cfg.path, dtype=fsdp_config.mixed_precision.param_dtype if lora_on else fsdp_config.model_dtype,
        override_config=dict(model_cfg.override_config),
        attn_implementation=model_cfg.attn_implementation, trust_remote_code=model_cfg.trust_remote_code,
        gradient_checkpointing=trainable and model_cfg.enable_gradient_checkpointing,
        device="meta" if weights_folder else None,
    )
    if lora_on:
        model = apply_lora(model, lora, base_path=model_cfg.path, seed=plan.seed)
    return TrainingEngine(model, fsdp_config, role=role, response_length=plan.max_response_length,
                          forward_micro=forward_micro, sp_size=sp_size, use_remove_padding=model_cfg.use_remove_padding,
                          optim_config=optim_config if trainable else None, total_training_steps=total_training_steps,
                          compile_blocks=compile_blocks, weights_folder=weights_folder,
                          update=update, seed=plan.seed)


def logprob_options(model_cfg: ModelConfig, compute_entropy: bool) -> LogprobOptions:
    return LogprobOptions(compute_entropy, model_cfg.use_fused_kernels, model_cfg.fused_kernel_options.impl_backend)


class ActorWorker:
    """The policy being trained (one role; the rollout engine and the reference are separate workers)."""

    def __init__(self, model_cfg: ModelConfig, actor_cfg: ActorConfig, logprob_micro: MicroBatching, plan: RunPlan):
        self.model_cfg = model_cfg
        self.cfg = actor_cfg
        self.logprob_micro = logprob_micro
        self.plan = plan
        self.engine: TrainingEngine | None = None
        self.loss_implementation = None
        if model_cfg.use_fused_kernels:
            self.loss_implementation = implementation_name(model_cfg.fused_kernel_options.impl_backend)

    @register(Dispatch.ALL)
    def init_model(self, total_training_steps: int) -> None:
        cfg = self.cfg
        update = UpdateSettings(
            rows_per_mini_batch=self.plan.actor.rows_per_mini_batch,
            micro=MicroBatching(self.plan.micro_batches.actor_update, cfg.use_dynamic_bsz,
                                cfg.ppo_max_token_len_per_gpu),
            epochs=cfg.ppo_epochs, shuffle=cfg.shuffle, grad_clip=cfg.grad_clip)
        self.engine = build_policy_engine(
            self.model_cfg, cfg.fsdp_config, role="actor", plan=self.plan, forward_micro=self.logprob_micro,
            sp_size=cfg.ulysses_sequence_parallel_size, trainable=True, optim_config=cfg.optim,
            total_training_steps=total_training_steps, update=update,
            compile_blocks=cfg.use_torch_compile and self.plan.allow_compile)

    @property
    def model(self) -> torch.nn.Module:
        return self.engine.model

    @register(Dispatch.RANK0)
    def model_config(self):
        return self.model.config

    @property
    def is_lora(self) -> bool:
        return is_lora_model(self.model)

    def dispatch_layout(self):
        return self.engine.dispatch_layout() if self.engine is not None else None

    # ------------------------------------------------------------------------------------------- log-probs
    @register(Dispatch.DP_SPLIT)
    def compute_logprobs(self, batch: Batch) -> Batch:
        """``old_logprobs`` [B, R] and ``entropy`` [B, R] at the rollout temperature (and ``sum_pi_squared`` [B, R]
        with ``actor.calculate_sum_pi_squared``)."""
        options = logprob_options(self.model_cfg, compute_entropy=True)
        options.compute_sum_pi_squared = self.cfg.calculate_sum_pi_squared  # optimal-token-baseline estimators

        def forward(mb: Batch) -> dict[str, torch.Tensor]:
            stats = self.engine.forward_logprob_stats(mb, self.plan.logprob_temperature, options)
            out = {"old_logprobs": stats["logprobs"], "entropy": stats["entropy"]}
            if "sum_pi_squared" in stats:
                out["sum_pi_squared"] = stats["sum_pi_squared"]
            return out

        return self.engine.infer(batch, forward)

    @register(Dispatch.DP_SPLIT)
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        """With LoRA, the reference policy is this model with its adapter off: ``ref_logprobs`` [B, R] without a
        second copy of the weights."""
        options = logprob_options(self.model_cfg, compute_entropy=False)

        def forward(mb: Batch) -> dict[str, torch.Tensor]:
            return {"ref_logprobs": self.engine.forward_logprobs(mb, self.plan.logprob_temperature, options)[0]}

        with adapter_disabled(self.engine.compute_model):
            return self.engine.infer(batch, forward)

    # ------------------------------------------------------------------------------------------- update
    @register(Dispatch.DP_SPLIT)
    def update_policy(self, batch: Batch) -> WorkerOutput:
        """PPO update over ``batch`` (this rank's rows); metrics averaged over mini-batches."""
        return WorkerOutput(metrics=self.engine.update(batch, self.micro_loss))

    def micro_loss(self, mb: Batch, denominators: dict[str, torch.Tensor]) -> MicroLoss:
        cfg, device = self.cfg, self.engine.device
        need_entropy = cfg.entropy_coeff != 0
        options = logprob_options(self.model_cfg, need_entropy)
        logprobs, entropy = self.engine.forward_logprobs(mb, self.plan.logprob_temperature, options)
        response_mask = mb["response_mask"].to(device)
        agg = dict(loss_agg_mode=cfg.loss_agg_mode, global_num_tokens=denominators["global_num_tokens"],
                   global_num_seqs=denominators["global_num_seqs"],
                   loss_scale_factor=cfg.loss_scale_factor or self.plan.max_response_length)
        ref = mb["ref_logprobs"].to(device) if cfg.use_kl_loss else None
        low, high = resolved_clip_ratios(cfg.clip_ratio, cfg.clip_ratio_low, cfg.clip_ratio_high)
        pl = cfg.policy_loss
        loss_mode = self.plan.policy_loss_mode  # bypass_mode in algorithm.rollout_correction's bypass mode
        weights = mb["rollout_is_weights"].to(device) if "rollout_is_weights" in mb else None
        inputs = PolicyLossInputs(
            old_logprobs=mb["old_logprobs"].to(device), logprobs=logprobs, advantages=mb["advantages"].to(device),
            response_mask=response_mask, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=cfg.clip_ratio_c,
            clip_cov_ratio=pl.clip_cov_ratio, clip_cov_lb=pl.clip_cov_lb, clip_cov_ub=pl.clip_cov_ub,
            kl_cov_ratio=pl.kl_cov_ratio, ppo_kl_coef=pl.ppo_kl_coef, rollout_is_weights=weights,
            rollout_correction=self.plan.bypass_correction, ref_logprobs=ref, kl_loss_type=cfg.kl_loss_type,
            tau_pos=cfg.tau_pos, tau_neg=cfg.tau_neg, dro_beta=pl.dro_beta, **agg)
        policy = compute_policy_loss(loss_mode=loss_mode, inputs=inputs, implementation=self.loss_implementation)
        loss = policy.loss
        metrics = {k if "/" in k else f"actor/{k}": v for k, v in policy.metrics.items()}  # rollout_corr/* as is
        if need_entropy:
            loss = loss + entropy_bonus(entropy=entropy, response_mask=response_mask, entropy_coeff=cfg.entropy_coeff,
                                        **agg).loss
        if ref is not None:
            kl = kl_loss(logprobs=logprobs, ref_logprobs=ref, response_mask=response_mask,
                         kl_loss_coef=cfg.kl_loss_coef, kl_type=cfg.kl_loss_type, token_kl=policy.token_kl, **agg)
            loss = loss + kl.loss
            metrics["actor/kl_loss"] = kl.metrics["kl_loss"]
            metrics["actor/kl_coef"] = torch.tensor(cfg.kl_loss_coef)
        return MicroLoss(loss, metrics, {"actor/pg_loss": policy.loss.detach()})

    # ------------------------------------------------------------------------------------------- checkpoints
    @register(Dispatch.ALL)
    def save_checkpoint(self, path: str, tokenizer=None) -> None:
        self.engine.save(path, self.cfg.checkpoint.save_contents, tokenizer)

    @register(Dispatch.ALL)
    def load_checkpoint(self, path: str) -> None:
        self.engine.load(path, self.cfg.checkpoint.load_contents)

    # ------------------------------------------------------------------------------------------- weights
    @property
    def generation_module(self) -> torch.nn.Module:
        """The module an in-process (hf) rollout engine generates with: the compute copy."""
        return self.engine.compute_model

    def named_full_weights(self):
        """(HF name, full tensor) one at a time, for the rollout engine (gathered from shards when sharded)."""
        if self.is_lora:  # an engine that takes plain weights gets W + scale * B @ A
            return merged_named_weights(self.model)
        return iter_full_parameters(self.model)

    def named_base_weights(self):
        """LoRA: the frozen base's (HF name, full tensor), for an engine that takes the adapter separately."""
        with adapter_disabled(self.model):
            yield from merged_named_weights(self.model)

    def adapter_for_rollout(self) -> tuple[dict[str, torch.Tensor], dict]:
        """LoRA: the adapter's full tensors on the host (PEFT keys) and its PEFT config as a dict. Collective."""
        tensors = {key: tensor.clone() for key, tensor in adapter_tensors(self.model, device="cpu")}
        return tensors, peft_config_dict(self.model.peft_config[ADAPTER_NAME])
