"""PRIME (``reward_model.reward_manager=prime``, verl-recipe's prime): its settings for the trainer and the PRM, and
the checks that need more than one key. Each problem names the key and what to change."""

from __future__ import annotations

import math
from dataclasses import dataclass

from npu_rl.config.schema import PPOConfig
from npu_rl.core.prime import GRANULARITIES, LOSS_TYPES, NORMS

PRIME_MANAGER = "prime"
UPDATES = ("before", "none")


@dataclass(frozen=True)
class PrimeSpec:
    """What the trainer and the implicit PRM read of a PRIME config (core/prime.py has the formulas)."""

    use_prm: bool  # reward_model.enable: an implicit PRM scores and trains; else only the outcome's advantage
    update: str  # reward_model.model.update: before | none
    beta: float  # reward_model.model.beta_train
    granularity: str  # reward_model.prime_granularity
    norm: str  # reward_model.prime_norm
    reward_dpo_coef: float
    reward_gt_coef: float
    filter_accuracy: bool
    accuracy_lower_bound: float
    accuracy_upper_bound: float
    filter_truncate: bool
    keep_prompts: int  # data.train_batch_size: the groups kept of the oversampled generation batch


def is_prime(config: PPOConfig) -> bool:
    return config.reward_model.reward_manager == PRIME_MANAGER


def prime_spec(config: PPOConfig) -> PrimeSpec | None:
    """PRIME's settings, or None when the run is not PRIME."""
    if not is_prime(config):
        return None
    rm, data, algo = config.reward_model, config.data, config.algorithm
    return PrimeSpec(use_prm=bool(rm.enable), update=str(rm.model.update), beta=float(rm.model.beta_train),
                     granularity=str(rm.prime_granularity), norm=str(rm.prime_norm),
                     reward_dpo_coef=float(algo.reward_dpo_coef), reward_gt_coef=float(algo.reward_gt_coef),
                     filter_accuracy=bool(data.filter_accuracy),
                     accuracy_lower_bound=float(data.accuracy_lower_bound),
                     accuracy_upper_bound=float(data.accuracy_upper_bound), filter_truncate=bool(data.filter_truncate),
                     keep_prompts=int(data.train_batch_size))


def prime_config_problems(config: PPOConfig) -> list[str]:
    """PRIME's keys set outside PRIME, and the settings PRIME cannot run with."""
    data, rm, algo = config.data, config.reward_model, config.algorithm
    if not is_prime(config):
        used = [f"data.{k}" for k in ("filter_accuracy", "filter_truncate") if getattr(data, k)]
        used += ["data.oversample_factor"] if data.oversample_factor != 1 else []
        return [f"{key} is read only by PRIME: set reward_model.reward_manager=prime (python -m "
                "npu_rl.trainer.main_prime), or leave it at its default" for key in used]
    problems = []
    if algo.adv_estimator != "rloo":
        problems.append(f"algorithm.adv_estimator={algo.adv_estimator} with reward_model.reward_manager=prime: PRIME's "
                        "advantage is RLOO on each reward source (as verl's recipe, which supports only rloo); set "
                        "algorithm.adv_estimator=rloo")
    if config.actor_rollout_ref.rollout.n < 2:
        problems.append(f"actor_rollout_ref.rollout.n={config.actor_rollout_ref.rollout.n} with PRIME: the "
                        "leave-one-out baseline needs at least 2 samples per prompt")
    if rm.prime_granularity not in GRANULARITIES:
        problems.append(f"reward_model.prime_granularity={rm.prime_granularity}: expected one of {GRANULARITIES}")
    if rm.prime_norm not in NORMS:
        problems.append(f"reward_model.prime_norm={rm.prime_norm}: expected one of {NORMS}")
    if rm.model.update not in UPDATES:
        problems.append(f"reward_model.model.update={rm.model.update}: expected one of {UPDATES}")
    if rm.model.loss_type not in LOSS_TYPES:
        problems.append(f"reward_model.model.loss_type={rm.model.loss_type}: expected one of {LOSS_TYPES}")
    if rm.model.ref_type != "freeze":
        problems.append(f"reward_model.model.ref_type={rm.model.ref_type}: the PRM's reference is frozen; set "
                        "reward_model.model.ref_type=freeze")
    if not (math.isfinite(rm.model.beta_train) and rm.model.beta_train > 0):
        problems.append(f"reward_model.model.beta_train={rm.model.beta_train} must be > 0 and finite")
    if rm.mini_batch_size is not None and rm.mini_batch_size <= 0:
        problems.append(f"reward_model.mini_batch_size={rm.mini_batch_size} must be > 0 (samples per PRM step)")
    if rm.enable and algo.reward_dpo_coef == 0 and algo.reward_gt_coef == 0:
        problems.append("algorithm.reward_dpo_coef and algorithm.reward_gt_coef are both 0: PRIME's advantage would "
                        "be 0 everywhere; set at least one")
    if data.gen_batch_size is not None:
        problems.append(f"data.gen_batch_size={data.gen_batch_size} with PRIME: the generation batch is "
                        "data.train_batch_size x data.oversample_factor prompts; leave data.gen_batch_size unset")
    if algo.filter_groups.enable:
        problems.append("algorithm.filter_groups.enable=True with PRIME: PRIME filters groups with "
                        "data.filter_accuracy; turn algorithm.filter_groups off")
    if config.async_training.mode != "sync":
        problems.append(f"reward_model.reward_manager=prime with async_training.mode={config.async_training.mode}: "
                        "the implicit PRM is wired into the synchronous trainer only; use async_training.mode=sync")
    if config.distillation.enabled:
        problems.append("distillation.enabled=True with PRIME: not wired together; turn one off")
    return problems


def prime_notes(config: PPOConfig) -> list[str]:
    """What PRIME reads differently from the keys as written (printed at start-up)."""
    if is_prime(config) and config.algorithm.use_kl_in_reward:
        return ["algorithm.use_kl_in_reward=True has no effect with PRIME: its advantages read only the implicit "
                "PRM's scores and the outcomes (as verl's PRIME trainer); a KL term belongs in the actor's loss "
                "(actor_rollout_ref.actor.use_kl_loss)"]
    return []
