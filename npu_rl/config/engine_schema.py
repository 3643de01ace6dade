"""The settings every role's slice is built from (``npu_rl/config/schema.py`` holds the tree): the optimizer, FSDP2
for a model that trains and for one that does not (the reference, a reward model, a teacher), what a checkpoint
holds, and the rollout engines' pass-through arguments. Each field's description is the docstring under it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from npu_rl.config.rules import broken, finite


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
class CheckpointContentsConfig:
    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    load_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])


@dataclass
class EngineKwargsConfig:
    vllm: dict[str, Any] = field(default_factory=dict)
    """passed through to vllm.LLM(...)"""
    hf: dict[str, Any] = field(default_factory=dict)
    """passed through to model.generate(...)"""
