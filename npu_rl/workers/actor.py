"""The actor: the policy's log-probs (with entropy), and its loss for the engine's update.

Loss of one micro-batch (aggregated with the mini-batch's global denominators)::

    policy_loss(logprobs, old_logprobs, advantages)   # the registry's loss, fused implementation when asked
    - entropy_coeff * entropy                          # when entropy_coeff != 0
    + kl_loss_coef * kl(logprobs, ref_logprobs)        # when use_kl_loss
    + router_aux_loss_coef * aux_loss * seqs / global_seqs  # an MoE model's load-balancing loss, when its config
                                                       # sets output_router_logits (its share of the mini-batch)

With on-policy distillation (``distillation.enabled``; npu_rl/core/distillation.py) that loss becomes
``loss + distillation_loss_coef * L_distill(logprobs, teacher_logprobs)``, or ``L_distill`` alone with
``use_task_rewards=False``; its metrics are ``actor/distillation/*``. With ``loss_mode=forward_kl_topk`` the same
forward also gives the student's log-probs at the teacher's top-k ids (``teacher_topk_ids``) and its own top-k.

Mixture-of-experts models (npu_rl/models/moe.py): the update's forward captures the routing for the
``actor/moe/*`` metrics; ``router_replay.mode`` R3 replays the rollout's ``routed_experts`` in the log-prob pass
and the update, R2 records them in the log-prob pass and replays them in the update.
"""

from __future__ import annotations

import os

import torch

from npu_rl.config.derived import RunSettings
from npu_rl.config.schema import ActorConfig, ModelConfig
from npu_rl.controller.dispatch import Dispatch, register
from npu_rl.core import PolicyLossInputs, compute_policy_loss, entropy_bonus, kl_loss, resolved_clip_ratios
from npu_rl.core.distillation import combined_loss, distillation_loss
from npu_rl.models.forward import LogprobOptions
from npu_rl.models.fused_losses import implementation_name
from npu_rl.models.loader import load_causal_lm, resolve_model_path
from npu_rl.models.vision import freeze_vision_tower
from npu_rl.models import moe
from npu_rl.models.lora import (
    ADAPTER_NAME,
    LoraSpec,
    adapter_disabled,
    adapter_tensors,
    apply_lora,
    is_lora_model,
    merged_named_weights,
)
from npu_rl.parallel import dist
from npu_rl.parallel.checkpoint import PROCESSOR_FILES
from npu_rl.parallel.weights import iter_full_parameters
from npu_rl.protocol import Batch, WorkerOutput
from npu_rl.rollout.vllm_lora import peft_config_dict
from npu_rl.workers.engine import MicroLoss, Routing, TrainingEngine, UpdateSettings
from npu_rl.workers.model_runner import MicroBatching, sharded_load_folder


# The micro-batch tensors the loss reads (besides the forward's inputs), where present.
LOSS_INPUTS = ("response_mask", "old_logprobs", "advantages", "ref_logprobs", "rollout_is_weights", "teacher_logprobs",
               "teacher_topk_logprobs", "teacher_topk_ids")


def build_policy_engine(model_cfg: ModelConfig, fsdp_config, *, role: str, run_settings: RunSettings, forward_micro: MicroBatching,
                        sp_size: int, trainable: bool, optim_config=None, total_training_steps=None,
                        update: UpdateSettings | None = None, compile_blocks: bool = False,
                        freeze_vision: bool = False) -> TrainingEngine:
    """A causal LM from ``actor_rollout_ref.model`` on an engine: the actor's (trained) or the reference's.
    With ``lora_rank`` > 0 the trained one is a PEFT model: the frozen base loaded straight in the compute dtype,
    fp32 adapters (models/lora.py). On several ranks the model is built on the meta device and each rank reads
    only its shards (:func:`sharded_load_folder`). ``freeze_vision`` (``actor.freeze_vision_tower``): a Qwen-VL
    model's vision tower takes no gradient."""
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
        model = apply_lora(model, lora, base_path=model_cfg.path, seed=run_settings.seed)
    if trainable and freeze_vision:
        freeze_vision_tower(model)
    return TrainingEngine(model, fsdp_config, role=role, response_length=run_settings.max_response_length,
                          forward_micro=forward_micro, sp_size=sp_size, use_remove_padding=model_cfg.use_remove_padding,
                          optim_config=optim_config if trainable else None, total_training_steps=total_training_steps,
                          compile_blocks=compile_blocks, weights_folder=weights_folder,
                          update=update, seed=run_settings.seed)


def logprob_options(model_cfg: ModelConfig, compute_entropy: bool) -> LogprobOptions:
    return LogprobOptions(compute_entropy, model_cfg.use_fused_kernels, model_cfg.fused_kernel_options.impl_backend)


class ActorWorker:
    """The policy being trained (one role; the rollout engine and the reference are separate workers)."""

    def __init__(self, model_cfg: ModelConfig, actor_cfg: ActorConfig, logprob_micro: MicroBatching, run_settings: RunSettings):
        self.model_cfg = model_cfg
        self.cfg = actor_cfg
        self.logprob_micro = logprob_micro
        self.run_settings = run_settings
        self.engine: TrainingEngine | None = None
        self._step_load: torch.Tensor | None = None  # tokens per expert [L, E] of the mini-batch being stepped
        self.loss_implementation = None
        if model_cfg.use_fused_kernels:
            self.loss_implementation = implementation_name(model_cfg.fused_kernel_options.impl_backend)

    @register(Dispatch.ALL)
    def init_model(self, total_training_steps: int) -> None:
        cfg = self.cfg
        update = UpdateSettings(
            rows_per_mini_batch=self.run_settings.actor.rows_per_mini_batch,
            micro=MicroBatching(self.run_settings.micro_batches.actor_update, cfg.use_dynamic_bsz,
                                cfg.ppo_max_token_len_per_gpu),
            epochs=cfg.ppo_epochs, shuffle=cfg.shuffle, grad_clip=cfg.grad_clip)
        self.engine = build_policy_engine(
            self.model_cfg, cfg.fsdp_config, role="actor", run_settings=self.run_settings, forward_micro=self.logprob_micro,
            sp_size=cfg.ulysses_sequence_parallel_size, trainable=True, optim_config=cfg.optim,
            total_training_steps=total_training_steps, update=update,
            compile_blocks=cfg.use_torch_compile and self.run_settings.allow_compile,
            freeze_vision=cfg.freeze_vision_tower)
        if cfg.moe_router_bias_update_rate > 0 and not moe.has_correction_bias(self.engine.compute_model):
            raise ValueError(f"actor_rollout_ref.actor.moe_router_bias_update_rate={cfg.moe_router_bias_update_rate}"
                             f": {type(moe.base_model(self.engine.compute_model)).__name__} has no routing bias "
                             "(e_score_correction_bias, DeepSeek-V3); set it to 0")

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
        mode = self.replay_mode
        routing = Routing(capture=mode == "R2", replay=mode == "R3")

        def forward(mb: Batch) -> dict[str, torch.Tensor]:
            stats, routed = self.engine.forward_logprob_stats(mb, self.run_settings.logprob_temperature, options,
                                                              routing)
            out = {"old_logprobs": stats["logprobs"], "entropy": stats["entropy"]}
            if "sum_pi_squared" in stats:
                out["sum_pi_squared"] = stats["sum_pi_squared"]
            if routing.capture:  # R2: the experts this pass chose, replayed by the update
                out["routed_experts"] = routed.routed_experts(mb["attention_mask"].shape[1],
                                                              self.run_settings.max_response_length)
            return out

        try:
            return self.engine.infer(batch, forward)
        finally:
            self.engine.clear_routing()

    @property
    def replay_mode(self) -> str:
        """actor.router_replay.mode where the model is a mixture of experts, else "disabled"."""
        return self.cfg.router_replay.mode if self.engine.router_hooks is not None else "disabled"

    @register(Dispatch.DP_SPLIT)
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        """With LoRA, the reference policy is this model with its adapter off: ``ref_logprobs`` [B, R] without a
        second copy of the weights."""
        options = logprob_options(self.model_cfg, compute_entropy=False)

        def forward(mb: Batch) -> dict[str, torch.Tensor]:
            return {"ref_logprobs": self.engine.forward_logprobs(mb, self.run_settings.logprob_temperature, options)[0]}

        with adapter_disabled(self.engine.compute_model):
            return self.engine.infer(batch, forward)

    # ------------------------------------------------------------------------------------------- update
    @register(Dispatch.DP_SPLIT)
    def update_policy(self, batch: Batch) -> WorkerOutput:
        """PPO update over ``batch`` (this rank's rows); metrics averaged over mini-batches."""
        after_step = self._update_router_bias if self.cfg.moe_router_bias_update_rate > 0 else None
        self._step_load = None
        try:
            return WorkerOutput(metrics=self.engine.update(batch, self.micro_loss, after_step))
        finally:
            self.engine.clear_routing()

    def _update_router_bias(self, stepped: bool) -> dict[str, torch.Tensor]:
        """DeepSeek-V3's bias update from the mini-batch's tokens per expert on all dp ranks (after a taken step)."""
        load, self._step_load = self._step_load, None
        if not stepped or load is None:
            return {}
        runner = self.engine.runner
        load = dist.all_reduce_sum({"load": load}, runner.dp_group)["load"]
        models = [self.engine.model] + ([self.engine.compute_model] if runner.has_master_copy else [])
        bias = moe.update_correction_bias(models, load, self.cfg.moe_router_bias_update_rate)
        return {"actor/moe/correction_bias_abs_mean": bias}

    def micro_loss(self, mb: Batch, denominators: dict[str, torch.Tensor]) -> MicroLoss:
        cfg, device = self.cfg, self.engine.device
        need_entropy = cfg.entropy_coeff != 0
        options = logprob_options(self.model_cfg, need_entropy)
        moe_model = self.engine.router_hooks is not None
        routing = Routing(capture=moe_model, replay=self.replay_mode != "disabled")
        spec = self.run_settings.distillation
        teacher_ids = None
        if spec is not None and spec.uses_topk:  # the student's log-probs at the teacher's top-k ids, same forward
            options.topk, teacher_ids = spec.topk, mb["teacher_topk_ids"]
        # Copied before the forward is queued: a blocking host-to-device copy waits for all the device's queued
        # work (CUDA: ATen's memcpy_and_sync), so after it the host would sit idle until the forward had run, and
        # only then launch the backward (with 8-row micro-batches the update is bound by those launches).
        on_device = {key: mb[key].to(device) for key in LOSS_INPUTS if key in mb}
        stats, routed = self.engine.forward_logprob_stats(mb, self.run_settings.logprob_temperature, options, routing,
                                                          topk_ids=teacher_ids)
        logprobs, entropy = stats["logprobs"], stats.get("entropy")
        response_mask = on_device["response_mask"]
        agg = dict(loss_agg_mode=cfg.loss_agg_mode, global_num_tokens=denominators["global_num_tokens"],
                   global_num_seqs=denominators["global_num_seqs"],
                   loss_scale_factor=cfg.loss_scale_factor or self.run_settings.max_response_length)
        ref = on_device["ref_logprobs"] if cfg.use_kl_loss else None
        low, high = resolved_clip_ratios(cfg.clip_ratio, cfg.clip_ratio_low, cfg.clip_ratio_high)
        pl = cfg.policy_loss
        loss_mode = self.run_settings.policy_loss_mode  # bypass_mode in algorithm.rollout_correction's bypass mode
        weights = on_device.get("rollout_is_weights")
        inputs = PolicyLossInputs(
            old_logprobs=on_device["old_logprobs"], logprobs=logprobs, advantages=on_device["advantages"],
            response_mask=response_mask, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=cfg.clip_ratio_c,
            clip_cov_ratio=pl.clip_cov_ratio, clip_cov_lb=pl.clip_cov_lb, clip_cov_ub=pl.clip_cov_ub,
            kl_cov_ratio=pl.kl_cov_ratio, ppo_kl_coef=pl.ppo_kl_coef, rollout_is_weights=weights,
            rollout_correction=self.run_settings.bypass_correction, ref_logprobs=ref, kl_loss_type=cfg.kl_loss_type,
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
        if routed is not None:
            loss = loss + self._router_loss(routed, metrics, response_mask, denominators)
        shares, extremes = {"actor/pg_loss": policy.loss.detach()}, {}
        if spec is not None:
            if spec.uses_topk:
                topk = {"student_topk_logprobs": stats["topk_logprobs"], "student_topk_ids": stats["topk_ids"],
                        "teacher_topk_logprobs": on_device["teacher_topk_logprobs"],
                        "teacher_topk_ids": on_device["teacher_topk_ids"]}
                distill = distillation_loss(inputs=inputs, spec=spec, topk=topk)
            else:
                distill = distillation_loss(inputs=inputs, spec=spec,
                                            teacher_logprobs=on_device["teacher_logprobs"])
            loss = combined_loss(loss, distill.loss, spec)
            shares["actor/distillation/loss"] = distill.loss.detach()
            for key, value in distill.metrics.items():
                target = extremes if key.endswith(("_min", "_max")) else metrics
                target[f"actor/{key}"] = value
        return MicroLoss(loss, metrics, shares, extremes)

    def _router_loss(self, routed, metrics: dict[str, torch.Tensor], response_mask: torch.Tensor,
                     denominators: dict[str, torch.Tensor]) -> torch.Tensor | float:
        """Fills the ``actor/moe/*`` metrics; returns this micro-batch's share of the weighted auxiliary loss (its
        sequences over the mini-batch's), or 0 where the model adds none."""
        model = self.engine.compute_model
        metrics.update(routed.metrics(model, "actor/moe"))
        if self.cfg.moe_router_bias_update_rate > 0:  # this mini-batch's load, for the bias update after its step
            load = moe.expert_load(routed.hooks.stacked_indices(), routed.token_mask, routed.hooks.num_experts)
            self._step_load = load if self._step_load is None else self._step_load + load
        aux = moe.aux_loss(model, routed.hooks, routed.token_mask)
        if aux is None:
            return 0.0
        metrics["actor/moe/aux_loss"] = aux.detach()
        enabled, coef = moe.aux_loss_settings(model)
        if not enabled or coef == 0:
            return 0.0
        share = response_mask.bool().any(dim=-1).sum() / denominators["global_num_seqs"].clamp(min=1)
        return coef * aux * share

    # ------------------------------------------------------------------------------------------- checkpoints
    @register(Dispatch.ALL)
    def save_checkpoint(self, path: str, tokenizer=None) -> None:
        """The engine's checkpoint, with the model folder's processor files (a vision-language model's
        preprocessor_config.json) beside the tokenizer, so a merge is a complete model folder."""
        folder = resolve_model_path(self.model_cfg.path)
        hf_files = [os.path.join(folder, n) for n in PROCESSOR_FILES if os.path.isfile(os.path.join(folder, n))]
        self.engine.save(path, self.cfg.checkpoint.save_contents, tokenizer, hf_files)

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
