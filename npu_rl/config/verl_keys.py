"""Every key of verl's config tree, accounted for: implemented, an alias, accepted without effect, or refused.

A verl run script passes Hydra overrides. A key our schema (``schema.py``) has is *implemented*. Any other key verl
has (its current generated ``ppo_trainer.yaml``, checked at 1dda039b9, and the older tree of verl 0.4 that many
scripts still use) is found in one of the tables below, so that nothing verl knows is ever an "unknown key":

- ``ALIASES``: verl's name for one of our keys (or subtree). Both names work; the override is rewritten to ours.
- ``NO_EFFECT``: accepted and dropped, with a one-line note saying why it changes nothing here.
- ``REFUSED``: a feature npu-rl does not have. Set to a value that leaves the feature off (``None``, ``False``, 0,
  an empty string or collection, or a value listed in ``OFF_VALUES``) it is accepted with a note; any other value
  stops the run naming the reason and what to use instead.
- ``BEING_BUILT``: refused for now, because another issue is adding the feature (the reason names it).

Lookups match a key or any subtree above it; the longest match wins. A key ending in ``_target_`` (verl's Hydra
instantiation targets) is always without effect. Keys are listed once per verl role where the roles differ; the
FSDP engine keys that repeat under actor, ref and critic are generated from one table (``_FSDP_ENGINE``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from npu_rl.config.profiler_schema import RoleToolConfig

ARR = "actor_rollout_ref"

# --------------------------------------------------------------------------------------------------- aliases
# verl key (or subtree) -> ours. The target may itself be an alias or be without effect.
ALIASES: dict[str, str] = {
    # critic: verl >= 0.5 keeps the critic's FSDP settings at critic.fsdp, we at critic.model.fsdp_config
    "critic.fsdp": "critic.model.fsdp_config",
    "critic.fsdp.ulysses_sequence_parallel_size": "critic.ulysses_sequence_parallel_size",
    # verl >= 0.6 keeps the sequence-parallel size and a few per-role switches inside fsdp_config
    f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size": f"{ARR}.actor.ulysses_sequence_parallel_size",
    f"{ARR}.ref.fsdp_config.ulysses_sequence_parallel_size": f"{ARR}.ref.ulysses_sequence_parallel_size",
    f"{ARR}.actor.fsdp_config.entropy_from_logits_with_chunking": f"{ARR}.actor.entropy_from_logits_with_chunking",
    f"{ARR}.ref.fsdp_config.entropy_from_logits_with_chunking": f"{ARR}.ref.entropy_from_logits_with_chunking",
    f"{ARR}.actor.fsdp_config.entropy_checkpointing": f"{ARR}.actor.entropy_checkpointing",
    f"{ARR}.ref.fsdp_config.entropy_checkpointing": f"{ARR}.actor.entropy_checkpointing",
    f"{ARR}.ref.entropy_checkpointing": f"{ARR}.actor.entropy_checkpointing",
    f"{ARR}.actor.fsdp_config.use_torch_compile": f"{ARR}.actor.use_torch_compile",
    f"{ARR}.ref.fsdp_config.use_torch_compile": f"{ARR}.ref.use_torch_compile",
    f"{ARR}.actor.fsdp_config.strategy": f"{ARR}.actor.strategy",
    f"{ARR}.ref.fsdp_config.strategy": f"{ARR}.ref.strategy",
    "critic.fsdp.strategy": "critic.strategy",
    f"{ARR}.actor.fsdp_config.dtype": f"{ARR}.actor.fsdp_config.mixed_precision.param_dtype",
    f"{ARR}.ref.fsdp_config.dtype": f"{ARR}.ref.fsdp_config.mixed_precision.param_dtype",
    "critic.fsdp.dtype": "critic.model.fsdp_config.mixed_precision.param_dtype",
    # verl's engine config reads these from the model config
    f"{ARR}.actor.use_fused_kernels": f"{ARR}.model.use_fused_kernels",
    f"{ARR}.actor.use_remove_padding": f"{ARR}.model.use_remove_padding",
    # the optimizer's clip_grad is the role's grad_clip
    f"{ARR}.actor.optim.clip_grad": f"{ARR}.actor.grad_clip",
    "critic.optim.clip_grad": "critic.grad_clip",
    # weight-sync bucket: verl >= 0.7 moved it under checkpoint_engine
    f"{ARR}.rollout.checkpoint_engine.update_weights_bucket_megabytes": f"{ARR}.rollout.update_weights_bucket_megabytes",
    # SAPO's temperatures sit on the actor; some scripts force-add them under policy_loss (verl then ignores them)
    f"{ARR}.actor.policy_loss.tau_pos": f"{ARR}.actor.tau_pos",
    f"{ARR}.actor.policy_loss.tau_neg": f"{ARR}.actor.tau_neg",
    f"{ARR}.model.tokenizer_path": "data.tokenizer",
    # verl >= 0.8's reward tree (reward.*) and the older one (reward_model.* + custom_reward_function.*)
    "reward.custom_reward_function": "custom_reward_function",
    "reward.reward_manager.name": "reward_model.reward_manager",
    "reward.reward_model.enable": "reward_model.enable",
    "reward.reward_model.model_path": "reward_model.model.path",
    "reward.num_workers": "reward_model.num_workers",
    # DAPO recipe: the dapo reward manager's keyword arguments
    "reward_model.reward_kwargs.overlong_buffer_cfg": "reward_model.overlong_buffer",
    "reward_model.reward_kwargs.max_resp_len": "reward_model.overlong_buffer.max_resp_len",
    # Ray: verl <= 0.4 had ray_init at the top level; the timeline file is not a ray.init() argument
    "ray_init": "ray_kwargs.ray_init",
    "ray_init.timeline_json_file": "ray_kwargs.timeline_json_file",
    "ray_kwargs.ray_init.timeline_json_file": "ray_kwargs.timeline_json_file",
}

# ----------------------------------------------------------------------------------------------- no effect
_FSDP_ENGINE: dict[str, str] = {  # keys of verl's FSDPEngineConfig we have no use for (actor, ref and critic)
    "use_orig_params": "FSDP2 (fully_shard) keeps the original parameters; there is no flat-parameter mode",
    "seed": "trainer.seed seeds every process",
    "entropy_from_logits_chunk_size": "entropy is computed in row chunks of npu-rl's own size, or fused",
    "pad_to_length": "micro-batches are packed or padded to their longest row, never to a fixed length",
    "pad_to_length_bucket": "micro-batches are packed or padded to their longest row, never to a fixed length",
    "forward_only": "set by verl per role; each npu-rl role knows whether it trains",
}
_FSDP_ROOTS = (f"{ARR}.actor.fsdp_config", f"{ARR}.ref.fsdp_config", "critic.model.fsdp_config")

NO_EFFECT: dict[str, str] = {
    **{f"{root}.{leaf}": why for root in _FSDP_ROOTS for leaf, why in _FSDP_ENGINE.items()},
    f"{ARR}.ref.fsdp_config.optimizer_offload": "the reference model has no optimizer",
    f"{ARR}.ref.fsdp_config.offload_policy": "the reference's parameters are offloaded with param_offload",
    f"{ARR}.ref.fsdp_config.fsdp_size": "the reference shards over the actor's data-parallel ranks",
    "reward_model.model.fsdp_config.fsdp_size": "the reward model shards over all ranks",
    f"{ARR}.actor.entropy_from_logits_chunk_size": "entropy is computed in row chunks of npu-rl's own size, or fused",
    f"{ARR}.ref.entropy_from_logits_chunk_size": "entropy is computed in row chunks of npu-rl's own size, or fused",
    f"{ARR}.actor.pad_to_length": "micro-batches are packed or padded to their longest row",
    f"{ARR}.ref.pad_to_length": "micro-batches are packed or padded to their longest row",
    f"{ARR}.actor.rollout_n": "follows actor_rollout_ref.rollout.n",
    f"{ARR}.ref.rollout_n": "follows actor_rollout_ref.rollout.n",
    f"{ARR}.actor.calculate_entropy": "the entropy is computed whenever actor.entropy_coeff != 0",
    f"{ARR}.actor.data_loader_seed": "mini-batch shuffling (actor.shuffle) is seeded from trainer.seed",
    "critic.data_loader_seed": "mini-batch shuffling (critic.shuffle) is seeded from trainer.seed",
    f"{ARR}.actor.checkpoint.strict": "checkpoints are always loaded strictly",
    f"{ARR}.actor.checkpoint.async_save": "checkpoints are written synchronously (DCP)",
    "critic.checkpoint.async_save": "checkpoints are written synchronously (DCP)",
    f"{ARR}.actor.optim.zero_indexed_step": "the LR schedule counts steps from 0 (verl's default, true)",
    "critic.optim.zero_indexed_step": "the LR schedule counts steps from 0 (verl's default, true)",
    "reward_model.model.use_shm": "models are read from disk; no /dev/shm copy",
    "data.use_shm": "data files are read from disk; no /dev/shm copy",
    f"{ARR}.model.hf_config_path": "the model's config.json is read from actor_rollout_ref.model.path",
    "critic.model.hf_config_path": "the model's config.json is read from critic.model.path",
    "critic.model.custom_chat_template": "the critic scores the actor's tokens; the chat template is the actor's",
    "critic.model.use_fused_kernels": "the critic has a value head; fused log-prob kernels apply to the actor",
    "critic.model.fused_kernel_options": "the critic has a value head; fused log-prob kernels apply to the actor",
    "reward_model.model.use_fused_kernels": "the reward model has a score head; fused kernels apply to the actor",
    f"{ARR}.rollout.skip_tokenizer_init": "the rollout engine receives token ids; its tokenizer only decodes",
    f"{ARR}.rollout.scheduling_policy": "vLLM's default scheduling (fcfs)",
    f"{ARR}.rollout.multi_stage_wake_up": "the engine wakes weights first, then the KV cache (always staged)",
    f"{ARR}.rollout.moe_load_balance_metrics_interval": "MoE load-balance metrics are not collected",
    f"{ARR}.rollout.nnodes": "the rollout runs colocated on the trainer's devices (hybrid engine)",
    f"{ARR}.rollout.n_gpus_per_node": "the rollout runs colocated on the trainer's devices (hybrid engine)",
    f"{ARR}.rollout.use_fire_sampling": "FIRE sampling was removed from verl; plain sampling here",
    f"{ARR}.rollout.checkpoint_engine.backend": "weights go to the engine in-process (naive backend)",
    f"{ARR}.nccl_timeout": "collectives use torch.distributed's default timeout (HCCL on Ascend)",
    "reward_model.enable_resource_pool": "the reward model shares the trainer's devices",
    "reward_model.n_gpus_per_node": "the reward model shares the trainer's devices",
    "reward_model.nnodes": "the reward model shares the trainer's devices",
    "reward.reward_model.enable_resource_pool": "the reward model shares the trainer's devices",
    "reward.reward_model.n_gpus_per_node": "the reward model shares the trainer's devices",
    "reward.reward_model.nnodes": "the reward model shares the trainer's devices",
    "reward.reward_manager.source": "reward managers are looked up by name (or a plug-in path)",
    "trainer.esi_redundant_time": "elastic-instance checkpointing is not implemented; use trainer.save_freq",
    "trainer.ray_wait_register_center_timeout": "workers are started by npu-rl's own controller",
    "trainer.use_v1": "npu-rl has one trainer (the synchronous PPO loop)",
    "trainer.use_legacy_worker_impl": "npu-rl has one worker implementation",
    "trainer.v1.trainer_mode": "npu-rl has one trainer (the synchronous PPO loop)",
    "trainer.v1.sync": "npu-rl has one trainer (the synchronous PPO loop)",
    "transfer_queue.metrics": "there is no transfer queue",
    "transfer_queue.backend": "there is no transfer queue",
    "sandbox_fusion": "no sandbox code execution; rule scorers and custom_reward_function only",
    "reward.sandbox_fusion": "no sandbox code execution; rule scorers and custom_reward_function only",
    "reward_model.sandbox_fusion": "no sandbox code execution; rule scorers and custom_reward_function only",
    "algorithm.pf_ppo": "only read with algorithm.use_pf_ppo=True, which is refused",
    "algorithm.filter_groups.max_inflight_gen_batches": "generation rounds run one at a time (synchronous)",
    "distillation.distillation_loss": "only read with distillation.enabled=True, which is refused",
    "distillation.teacher_models": "only read with distillation.enabled=True, which is refused",
    "distillation.teacher_key": "only read with distillation.enabled=True, which is refused",
    "distillation.n_gpus_per_node": "only read with distillation.enabled=True, which is refused",
    "distillation.nnodes": "only read with distillation.enabled=True, which is refused",
    "reward.reward_model.rollout": "the reward model is a sequence classifier here, not a generative judge",
    "reward_model.rollout": "the reward model is a sequence classifier here, not a generative judge",
    "skip": "rollout caching / replay for debugging is not implemented",
    f"{ARR}.model.mtp.speculative_algorithm": "only read with model.mtp.enable=True, which is refused",
    f"{ARR}.rollout.engine_kwargs.sglang": "the sglang engine is not supported; engine_kwargs.vllm applies",
    f"{ARR}.rollout.engine_kwargs.trtllm": "the TensorRT-LLM engine is not supported; engine_kwargs.vllm applies",
    f"{ARR}.rollout.trace.project_name": "only read with rollout.trace.backend set, which is refused",
    f"{ARR}.rollout.trace.experiment_name": "only read with rollout.trace.backend set, which is refused",
    f"{ARR}.rollout.trace.token2text": "only read with rollout.trace.backend set, which is refused",
    f"{ARR}.rollout.trace.max_samples_per_step_per_worker": "only read with rollout.trace.backend set",
    f"{ARR}.rollout.prometheus.port": "only read with rollout.prometheus.enable=True, which is refused",
    f"{ARR}.rollout.prometheus.file": "only read with rollout.prometheus.enable=True, which is refused",
    f"{ARR}.rollout.prometheus.served_model_name": "only read with rollout.prometheus.enable=True",
    f"{ARR}.rollout.disaggregation.prefill_replicas": "only read with disaggregation.enabled=True, refused",
    f"{ARR}.rollout.disaggregation.decode_replicas": "only read with disaggregation.enabled=True, refused",
    f"{ARR}.rollout.disaggregation.decode_tensor_model_parallel_size": "only read with disaggregation.enabled",
    f"{ARR}.rollout.disaggregation.transfer_backend": "only read with disaggregation.enabled=True, refused",
    f"{ARR}.rollout.disaggregation.bootstrap_port": "only read with disaggregation.enabled=True, refused",
    f"{ARR}.rollout.disaggregation.ib_device": "only read with disaggregation.enabled=True, refused",
    f"{ARR}.actor.qat.mode": "only read with qat.enable=True, which is refused",
    f"{ARR}.actor.qat.group_size": "only read with qat.enable=True, which is refused",
    f"{ARR}.actor.qat.ignore_patterns": "only read with qat.enable=True, which is refused",
    f"{ARR}.actor.qat.activation_observer": "only read with qat.enable=True, which is refused",
    f"{ARR}.actor.qat.quantization_config_path": "only read with qat.enable=True, which is refused",
    f"{ARR}.actor.router_replay.record_file": "only read with router_replay.mode set, which is refused",
    f"{ARR}.actor.router_replay.replay_file": "only read with router_replay.mode set, which is refused",
    f"{ARR}.ref.router_replay.record_file": "only read with router_replay.mode set, which is refused",
    f"{ARR}.ref.router_replay.replay_file": "only read with router_replay.mode set, which is refused",
    f"{ARR}.model.tiled_mlp.num_shards": "only read with tiled_mlp.enabled=True, which is refused",
    "critic.model.tiled_mlp.num_shards": "only read with tiled_mlp.enabled=True, which is refused",
    "trainer.v1.colocate_async": "only read by verl's asynchronous trainers, which are refused",
    "trainer.v1.separate_async": "only read by verl's asynchronous trainers, which are refused",
    "trainer.v1.sampler": "only read by verl's asynchronous trainers, which are refused",
}
for _root in _FSDP_ROOTS:  # verl's QAT and "turbo" FSDP engine: options of features refused below
    for _leaf in ("mode", "group_size", "ignore_patterns", "activation_observer", "quantization_config_path"):
        NO_EFFECT[f"{_root}.qat.{_leaf}"] = "only read with fsdp_config.qat.enable=True, which is refused"
    NO_EFFECT[f"{_root}.turbo_config"] = "verl's 'turbo' FSDP engine options; npu-rl's FSDP2 engine ignores them"
for _leaf in ("entropy_from_logits_with_chunking", "entropy_checkpointing"):
    NO_EFFECT[f"critic.model.fsdp_config.{_leaf}"] = "the critic computes no entropy"
NO_EFFECT["critic.model.fsdp_config.use_torch_compile"] = "there is no torch.compile path"

# ------------------------------------------------------------------------------------------------- refused
# key -> (why, what to use instead). Values that leave the feature off are accepted (see OFF_VALUES).
REFUSED: dict[str, tuple[str, str]] = {
    f"{ARR}.actor.freeze_vision_tower": ("vision-language models are not supported", "a text-only model"),
    # multi-modal data: verl's defaults (which text runs carry) are accepted, anything else is refused
    **{f"data.{key}": ("multi-modal (image / video / audio) data is not supported: prompts are text only",
                       "a text data set; leave the key at verl's default")
       for key in ("image_key", "video_key", "audio_key", "image_patch_size", "return_multi_modal_inputs",
                   "mm_processor_kwargs")},
    f"{ARR}.actor.use_prefix_grouper": ("shared-prompt forward (prefix grouper) is not implemented",
                                        "model.use_remove_padding=True packs the rows instead"),
    f"{ARR}.actor.qat.enable": ("quantisation-aware training is not implemented", "train in bf16"),
    f"{ARR}.actor.router_replay.mode": ("MoE router replay is not implemented", "leave it unset"),
    f"{ARR}.ref.router_replay.mode": ("MoE router replay is not implemented", "leave it unset"),
    f"{ARR}.actor.optim.optimizer_impl": ("only torch.optim's AdamW is wired", "optim.optimizer=AdamW"),
    "critic.optim.optimizer_impl": ("only torch.optim's AdamW is wired", "optim.optimizer=AdamW"),
    f"{ARR}.actor.optim.override_optimizer_config": ("extra optimizer arguments are not passed",
                                                     "optim.betas / optim.eps / optim.weight_decay"),
    "critic.optim.override_optimizer_config": ("extra optimizer arguments are not passed",
                                               "optim.betas / optim.eps / optim.weight_decay"),
    f"{ARR}.actor.fsdp_config.full_determinism": ("deterministic kernels are not switched on", "trainer.seed"),
    f"{ARR}.ref.fsdp_config.full_determinism": ("deterministic kernels are not switched on", "trainer.seed"),
    "critic.model.fsdp_config.full_determinism": ("deterministic kernels are not switched on", "trainer.seed"),
    f"{ARR}.rollout.full_determinism": ("deterministic sampling kernels are not switched on",
                                        "actor_rollout_ref.rollout.seed"),
    f"{ARR}.rollout.data_parallel_size": (("the rollout has one engine per tensor-parallel group (data parallel is "
                                           "implied by the device count)"), "rollout.tensor_model_parallel_size"),
    f"{ARR}.rollout.pipeline_model_parallel_size": ("pipeline-parallel rollout is not supported",
                                                    "rollout.tensor_model_parallel_size"),
    f"{ARR}.rollout.expert_parallel_size": ("a separate expert-parallel size is not supported",
                                            "rollout.enable_expert_parallel=True (EP over the TP group)"),
    f"{ARR}.rollout.logprobs_mode": ("the engine's log-probs are the raw ones (vLLM-Ascend ignores the mode)",
                                     "leave it at processed_logprobs / unset"),
    f"{ARR}.rollout.over_sample_rate": ("over-sampling with early stop belongs to the async rollout",
                                        "algorithm.filter_groups for DAPO-style sampling"),
    f"{ARR}.rollout.quantization": ("quantised rollout is not supported", "rollout.dtype=bfloat16"),
    f"{ARR}.rollout.quantization_config_file": ("quantised rollout is not supported", "rollout.dtype=bfloat16"),
    f"{ARR}.rollout.enable_rollout_routing_replay": ("MoE routing replay is not implemented", "leave it False"),
    f"{ARR}.rollout.mtp": ("multi-token-prediction speculative decoding is not supported", "leave it unset"),
    f"{ARR}.rollout.qat": ("quantisation-aware rollout is not supported", "leave it unset"),
    f"{ARR}.rollout.checkpoint_engine.engine_kwargs": ("weights are synced in-process (no checkpoint engine)",
                                                       "rollout.update_weights_bucket_megabytes"),
    f"{ARR}.rollout.checkpoint_engine.custom_backend_module": ("weights are synced in-process",
                                                               "rollout.update_weights_bucket_megabytes"),
    f"{ARR}.rollout.trace.backend": ("rollout tracing (weave / mlflow) is not implemented",
                                     "trainer.rollout_data_dir dumps the generations"),
    f"{ARR}.rollout.prometheus.enable": ("the rollout exports no Prometheus metrics", "the trainer's logger"),
    f"{ARR}.rollout.disaggregation.enabled": ("prefill/decode disaggregation is not supported", "leave it False"),
    f"{ARR}.model.mtp": ("multi-token prediction is not supported", "leave model.mtp.enable=False"),
    "critic.model.mtp": ("multi-token prediction is not supported", "leave model.mtp.enable=False"),
    **{f"{root}.qat.enable": ("quantisation-aware training is not implemented", "train in bf16")
       for root in _FSDP_ROOTS},
    f"{ARR}.model.tiled_mlp.enabled": ("tiled MLP is not implemented", "model.enable_gradient_checkpointing"),
    "critic.model.tiled_mlp.enabled": ("tiled MLP is not implemented", "model.enable_gradient_checkpointing"),
    "critic.model.enable_activation_offload": ("activation offload is not implemented",
                                               "critic.model.enable_gradient_checkpointing"),
    "critic.model.use_liger": ("Liger kernels are not supported (not on NPU)", "leave it False"),
    "critic.model.lora": ("LoRA is not supported for the critic", "full fine-tuning"),
    "algorithm.use_pf_ppo": ("preference-feedback PPO reweighting is not implemented", "leave it False"),
    "data.train_max_samples": ("sub-sampling the training set is not implemented", "a smaller parquet file"),
    "data.val_max_samples": ("sub-sampling the validation set is not implemented", "a smaller parquet file"),
    "data.tool_config_path": ("tool calling belongs to the multi-turn agent loop (not implemented)",
                              "single-turn prompts"),
    "data.function_tool_path": ("tool calling belongs to the multi-turn agent loop (not implemented)",
                                "single-turn prompts"),
    "distillation.enabled": ("on-policy distillation is not implemented", "leave it False"),
    "transfer_queue.enable": ("verl's transfer queue is not implemented", "leave it False"),
    "trainer.v1": ("verl's asynchronous trainers are not implemented", "the synchronous PPO trainer"),
    "reward.reward_manager.module": ("reward managers are named in reward_model.reward_manager",
                                     "reward_model.reward_manager=<name or pkg.mod:Class>"),
    "reward_model.reward_loop_source": ("the reward loop of verl's async rollout is not implemented",
                                        "reward_model.reward_manager"),
    "reward_model.reward_loop_module_path": ("the reward loop of verl's async rollout is not implemented",
                                             "reward_model.reward_manager"),
    "reward_model.reward_loop_class_name": ("the reward loop of verl's async rollout is not implemented",
                                            "reward_model.reward_manager"),
    # verl's other model engines (config groups model_engine=megatron|torchtitan|veomni and their subtrees)
    "model_engine": ("verl's megatron / torchtitan / veomni engines are not supported; npu-rl trains with FSDP2",
                     "leave model_engine out (dp) and use fsdp_config.*"),
    **{f"{role}.{engine}": (f"the {engine} engine is not supported; npu-rl trains with FSDP2",
                            f"{role.replace('critic', 'critic.model')}.fsdp_config.*")
       for role in (f"{ARR}.actor", f"{ARR}.ref", "critic") for engine in ("megatron", "veomni", "torchtitan")},
    # verl <= 0.4 Nsight switches (the profiler tree replaced them)
    "trainer.profile_steps": ("verl 0.4's profiling keys are not read", "global_profiler.steps"),
    "trainer.controller_nsight_options": ("verl 0.4's Nsight options are not read",
                                          "global_profiler.tool=nsys and global_profiler.global_tool_config.nsys"),
    "trainer.worker_nsight_options": ("verl 0.4's Nsight options are not read",
                                      "global_profiler.tool=nsys and global_profiler.global_tool_config.nsys"),
}

# Features other issues are adding right now: refused until they land (set to "off" they are accepted).
BEING_BUILT: dict[str, str] = {}  # features other issues were adding; LoRA, rollout correction and the profiler landed
# verl's nested LoRA tree: its FSDP engine reads lora.merge (ours too, schema.LoraOptions); the rest is Megatron's.
REFUSED.update({
    f"{ARR}.model.lora.{leaf}": (
        "verl's nested LoRA settings (Megatron's engine) are not read here; of that tree only lora.merge is",
        "actor_rollout_ref.model.lora_rank / lora_alpha / target_modules / exclude_modules / lora_adapter_path")
    for leaf in ("type", "rank", "alpha", "dropout", "target_modules", "exclude_modules", "dropout_position",
                 "lora_A_init_method", "lora_B_init_method", "a2a_experimental", "dtype", "adapter_path",
                 "freeze_vision_model", "freeze_vision_projection", "freeze_language_model")})

# Agent loops (npu_rl/agent/, docs/agents.md): the parts of verl's multi_turn / agent trees not built here.
REFUSED.update({
    f"{ARR}.rollout.multi_turn.function_tool_path": (
        "tools as plain Python functions are not supported", "a tool class in multi_turn.tool_config_path"),
    f"{ARR}.rollout.multi_turn.use_inference_chat_template": (
        "conversations keep the tokens as generated (verl's default, False)", "leave it False"),
    f"{ARR}.rollout.multi_turn.num_repeat_rollouts": (
        "repeated rollouts of one conversation are not supported", "rollout.n"),
    f"{ARR}.rollout.multi_turn.completion_callback": (
        "verl 0.4's completion callbacks are not supported", "a custom agent loop (rollout.agent.default_agent_loop)"),
    f"{ARR}.rollout.agent.custom_async_server": (
        "a custom async server is not supported: agent loops drive the in-process engine",
        "rollout.name=vllm|hf"),
})
NO_EFFECT[f"{ARR}.rollout.multi_turn.tokenization_sanity_check_mode"] = (
    "nothing is re-tokenised: conversations are built token by token, tool / user turns from the template's delta")

# Refused keys whose listed values (besides None / False / 0 / "" / empty) leave the feature off.
OFF_VALUES: dict[str, tuple[Any, ...]] = {
    f"{ARR}.actor.optim.optimizer_impl": ("torch.optim",),
    "critic.optim.optimizer_impl": ("torch.optim",),
    f"{ARR}.rollout.data_parallel_size": (1,),
    f"{ARR}.rollout.pipeline_model_parallel_size": (1,),
    f"{ARR}.rollout.expert_parallel_size": (1,),
    f"{ARR}.rollout.logprobs_mode": ("processed_logprobs",),
    f"{ARR}.rollout.checkpoint_engine.custom_backend_module": (),
    f"{ARR}.model.lora.type": ("lora",),
    "critic.model.lora_alpha": (16,),
    "critic.model.target_modules": ("all-linear",),
    "critic.model.lora.type": ("lora",),
    "algorithm.rollout_correction.loss_type": ("ppo_clip",),
    "algorithm.rollout_correction.rollout_is_threshold": (2.0,),
    "global_profiler.save_path": ("outputs/profile",),
    "trainer.v1.trainer_mode": ("sync",),
    "model_engine": ("dp", "fsdp"),
    "data.image_key": ("images",),  # verl's defaults for the multi-modal data keys
    "data.video_key": ("videos",),
    "data.audio_key": ("audios",),
    "data.image_patch_size": (14,),
    "data.return_multi_modal_inputs": (True,),
}


@dataclass(frozen=True)
class KeyStatus:
    """How npu-rl treats one verl key."""

    kind: str  # implemented | alias | no_effect | refused | being_built | unknown
    key: str  # the key as given
    target: str | None = None  # alias: our key (after following aliases)
    why: str = ""  # no_effect / refused / being_built: the reason
    instead: str = ""  # refused: what to use instead


def _longest_match(key: str, table: dict[str, Any]) -> str | None:
    best = None
    for entry in table:
        if (key == entry or key.startswith(entry + ".")) and (best is None or len(entry) > len(best)):
            best = entry
    return best


def _implemented(key: str) -> bool:
    """Whether the schema has ``key`` (a typed field, or an entry inside one of its free-form dicts)."""
    import dataclasses

    from npu_rl.config.introspect import schema_fields as _fields
    from npu_rl.config.schema import PPOConfig

    node: Any = PPOConfig
    for part in key.split("."):
        if not dataclasses.is_dataclass(node):
            return True  # inside a free-form dict
        fields = _fields(node)
        if part not in fields:
            return False
        node = fields[part]
    return True


def classify(key: str, _depth: int = 0) -> KeyStatus:
    """The status of ``key`` (no ``+``/``~`` prefix). Aliases are followed to what they land on."""
    if key.rpartition(".")[2] == "_target_":
        return KeyStatus("no_effect", key, why="verl's Hydra instantiation target; npu-rl's schema is typed")
    alias = _longest_match(key, ALIASES)
    if alias is not None and _depth < 4:
        target = ALIASES[alias] + key[len(alias):]
        landed = classify(target, _depth + 1)
        if landed.kind in ("implemented", "alias"):
            return KeyStatus("alias", key, target=landed.target or target)
        return KeyStatus(landed.kind, key, target=target, why=landed.why, instead=landed.instead)
    if _implemented(key):
        return KeyStatus("implemented", key, target=key)
    matches = {name: _longest_match(key, table) for name, table in
               (("no_effect", NO_EFFECT), ("refused", REFUSED), ("being_built", BEING_BUILT))}
    found = [(len(entry), name, entry) for name, entry in matches.items() if entry is not None]
    if not found:
        return KeyStatus("unknown", key)
    _, kind, entry = max(found)
    if kind == "no_effect":
        return KeyStatus("no_effect", key, why=NO_EFFECT[entry])
    if kind == "refused":
        why, instead = REFUSED[entry]
        return KeyStatus("refused", key, why=why, instead=instead)
    return KeyStatus("being_built", key, why=f"{BEING_BUILT[entry]} is being built and not available yet",
                     instead="leave it unset until that lands")


def is_off(key: str, value: Any) -> bool:
    """Whether ``value`` leaves the feature behind a refused ``key`` switched off."""
    if value is None or value is False or value == 0 or value in ("", "null", "none", "None", "false", "False"):
        return True
    if isinstance(value, (list, tuple, dict)) and not value:
        return True
    entry = _longest_match(key, OFF_VALUES)
    return entry is not None and value in OFF_VALUES[entry]


def all_entries() -> dict[str, str]:
    """Every table entry -> its kind (for docs and tests)."""
    out = {k: "alias" for k in ALIASES}
    out.update({k: "no_effect" for k in NO_EFFECT})
    out.update({k: "refused" for k in REFUSED})
    out.update({k: "being_built" for k in BEING_BUILT})
    return out


# Parts of verl's profiler trees the profiler here does not implement (npu_rl/trainer/profiling.py, docs/npu.md).
for _root in (f"{ARR}.actor.profiler", f"{ARR}.ref.profiler", f"{ARR}.rollout.profiler", "critic.profiler",
              "reward_model.profiler", "global_profiler"):
    REFUSED[f"{_root}.relocate_results"] = ("traces are written into the run folder and not moved afterwards",
                                            "read them from <run folder>/profile")
    for _leaf in ("finish_hook_cmd", "finish_hook_all_ranks", "finish_hook_ranks"):
        REFUSED[f"{_root}.{_leaf}"] = ("commands run after profiling are not supported", "run it after training")
    REFUSED[f"{_root}.discrete"] = ("verl 0.4's per-role discrete profiling flag is not read",
                                    "global_profiler.steps and the role's profiler.enable")
    for _tool in (f.name for f in dataclasses.fields(RoleToolConfig)):
        for _leaf in ("profile_token_start", "profile_token_end"):
            REFUSED[f"{_root}.tool_config.{_tool}.{_leaf}"] = (
                "profiling a window of decoded tokens inside the rollout is not supported",
                "profile the whole rollout phase (the role's profiler.enable)")
