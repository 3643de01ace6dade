"""``algorithm.*`` (verl's names): the advantage estimator, the KL penalty in the reward and its controller, DAPO's
dynamic sampling (filter_groups), rollout correction, PRIME's advantage weights. Part of the tree in
``npu_rl/config/schema.py``; each field's description is the docstring under it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from npu_rl.config.rules import broken, finite


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
