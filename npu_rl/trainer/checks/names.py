"""Keys that name something, checked against the code that implements the names (see the package docstring)."""

from __future__ import annotations

from typing import Callable

from npu_rl.config.derived import as_list
from npu_rl.config.errors import ConfigError
from npu_rl.config.schema import PPOConfig
from npu_rl.controller.worker_group import CONTROLLERS
from npu_rl.core import (
    ADV_ESTIMATORS,
    KL_CONTROLLER_TYPES,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    check_kl_type,
    estimator_needs,
)
from npu_rl.data.dataset import TRUNCATION_MODES
from npu_rl.kernels import BACKENDS
from npu_rl.models.lora import LoraSpec, check_spec
from npu_rl.parallel.fsdp import STRATEGIES
from npu_rl.reward import check_reward_config
from npu_rl.rollout.factory import ROLLOUT_ENGINES
from npu_rl.tracking.backends import LOGGERS, check_trackers
from npu_rl.trainer.checkpoint import RESUME_MODES
from npu_rl.trainer.rollout_correction import correction_spec
from npu_rl.trainer.sampling import FILTER_METRICS
from npu_rl.utils.dtypes import DTYPES
from npu_rl.utils.lr_schedule import SCHEDULES
from npu_rl.workers.engine import OPTIMIZERS

CAUGHT = (ValueError, TypeError, ImportError, AttributeError, FileNotFoundError, OSError)


class Problems(list):
    """A list of problem messages with the two ways checks add to it."""

    def choice(self, key: str, value, choices) -> None:
        if value not in choices:
            self.append(f"{key}={value!r} is not one of {', '.join(map(str, choices))}")

    def attempt(self, fn: Callable[[], object], prefix: str = "") -> None:
        """Run a check that raises (a registry lookup, a file load) and keep its message."""
        try:
            fn()
        except CAUGHT as exc:
            self.extend(prefix + m for m in (exc.problems if isinstance(exc, ConfigError) else [str(exc)]))


def estimator_resolves(config: PPOConfig) -> bool:
    """Whether ``algorithm.adv_estimator`` names an estimator (an unknown one is reported by the registry check;
    the checks that depend on what it needs are skipped until it resolves)."""
    try:
        ADV_ESTIMATORS.get(config.algorithm.adv_estimator)
    except CAUGHT:
        return False
    return True


def name_problems(config: PPOConfig, use_critic: bool) -> list[str]:
    p = Problems()
    _choices(p, config)
    _registries(p, config, use_critic)
    _estimator_inputs(p, config)
    _lora(p, config, use_critic)
    return p


def _choices(p: Problems, config: PPOConfig) -> None:
    arr = config.actor_rollout_ref
    p.choice("data.truncation", config.data.truncation, TRUNCATION_MODES)
    p.choice("actor_rollout_ref.rollout.name", arr.rollout.name, ROLLOUT_ENGINES)
    for key, strategy in (("actor_rollout_ref.actor.strategy", arr.actor.strategy),
                          ("critic.strategy", config.critic.strategy),
                          ("reward_model.strategy", config.reward_model.strategy)):
        p.choice(key, strategy, STRATEGIES)
    p.choice("trainer.resume_mode", config.trainer.resume_mode, RESUME_MODES)
    p.choice("trainer.controller", config.trainer.controller, CONTROLLERS)
    p.choice("algorithm.kl_ctrl.type", config.algorithm.kl_ctrl.type, KL_CONTROLLER_TYPES)
    p.choice("actor_rollout_ref.model.fused_kernel_options.impl_backend", arr.model.fused_kernel_options.impl_backend,
             BACKENDS)
    for key, optim in (("actor_rollout_ref.actor.optim", arr.actor.optim), ("critic.optim", config.critic.optim)):
        p.choice(f"{key}.lr_scheduler_type", optim.warmup_style or optim.lr_scheduler_type, SCHEDULES)
        if optim.optimizer.lower() not in OPTIMIZERS:
            p.append(f"{key}.optimizer={optim.optimizer!r}: only AdamW")
    for key, fsdp in (("actor_rollout_ref.actor.fsdp_config", arr.actor.fsdp_config),
                      ("critic.model.fsdp_config", config.critic.model.fsdp_config)):
        p.choice(f"{key}.model_dtype", fsdp.model_dtype, DTYPES)
        p.choice(f"{key}.mixed_precision.param_dtype", fsdp.mixed_precision.param_dtype, DTYPES)
    loggers = [str(n) for n in as_list(config.trainer.logger)]
    for name in loggers:
        p.choice("trainer.logger", name, LOGGERS)
    p.extend(check_trackers(loggers))
    fg = config.algorithm.filter_groups
    if fg.enable and fg.metric not in FILTER_METRICS:
        p.append(f"algorithm.filter_groups.enable=True needs algorithm.filter_groups.metric set to one of "
                 f"{', '.join(FILTER_METRICS)} (got {fg.metric!r})")
    if arr.model.use_liger:
        p.append("actor_rollout_ref.model.use_liger: Liger is not supported (and not on NPU); use "
                 "actor_rollout_ref.model.use_fused_kernels=True")


def _registries(p: Problems, config: PPOConfig, use_critic: bool) -> None:
    arr = config.actor_rollout_ref
    p.attempt(lambda: ADV_ESTIMATORS.check(config.algorithm.adv_estimator))
    p.attempt(lambda: POLICY_LOSSES.check(arr.actor.policy_loss.loss_mode))
    p.choice("actor_rollout_ref.actor.loss_agg_mode", arr.actor.loss_agg_mode, LOSS_AGG_MODES)
    if use_critic:
        p.choice("critic.loss_agg_mode", config.critic.loss_agg_mode, LOSS_AGG_MODES)
    for used, key, value in ((arr.actor.use_kl_loss, "actor_rollout_ref.actor.kl_loss_type", arr.actor.kl_loss_type),
                             (config.algorithm.use_kl_in_reward, "algorithm.kl_penalty", config.algorithm.kl_penalty)):
        if not used:
            continue
        p.attempt(lambda: check_kl_type(value), f"{key}: ")
        if value.rstrip("+") == "full":
            p.append(f"{key}={value!r}: the full-vocabulary KL exists as a kernel (npu_rl.kernels.full_vocab_kl) but "
                     "the trainer does not feed it the reference's hidden states yet; use low_var_kl (k3), kl (k1) or "
                     "mse (k2)")
    p.attempt(lambda: check_reward_config(config.reward_model, config.custom_reward_function, config.data))
    p.attempt(lambda: correction_spec(config.algorithm.rollout_correction), "algorithm.rollout_correction.")


def _estimator_inputs(p: Problems, config: PPOConfig) -> None:
    """What the newer estimators / losses need that the trainer does not produce on its own."""
    algo, actor = config.algorithm, config.actor_rollout_ref.actor
    if estimator_resolves(config) and "sum_pi_squared" in estimator_needs(algo.adv_estimator) \
            and not actor.calculate_sum_pi_squared:
        p.append(f"algorithm.adv_estimator={algo.adv_estimator!r} needs actor_rollout_ref.actor.calculate_sum_pi_"
                 "squared=True (the actor then computes sum_v pi_v^2 per token with the old log-probs), as in verl")
    if actor.calculate_sum_pi_squared and config.actor_rollout_ref.model.use_fused_kernels:
        p.append("actor_rollout_ref.actor.calculate_sum_pi_squared=True is computed on the plain log-prob path; the "
                 "fused kernels do not produce it: set actor_rollout_ref.model.use_fused_kernels=False")
    if algo.adv_estimator == "gdpo":
        keys, weights = as_list(algo.gdpo_reward_keys), algo.gdpo_reward_weights
        if not keys:
            p.append("algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys: the reward components (keys of "
                     "the dict your compute_score returns), e.g. '[accuracy_reward,format_reward]'")
        if weights is not None and len(as_list(weights)) != len(keys):
            p.append(f"algorithm.gdpo_reward_weights has {len(as_list(weights))} entries for {len(keys)} "
                     "algorithm.gdpo_reward_keys")


def _lora(p: Problems, config: PPOConfig, use_critic: bool) -> None:
    p.extend(check_spec(LoraSpec.from_config(config.actor_rollout_ref.model)))
    critic = LoraSpec.from_config(config.critic.model, key="critic.model")
    if critic.enabled and use_critic:
        p.append("critic.model.lora_rank > 0: LoRA on the critic is not supported yet (the actor's is: "
                 "actor_rollout_ref.model.lora_rank); set critic.model.lora_rank=0")
    if critic.adapter_path and use_critic:
        p.append("critic.model.lora_adapter_path is set but critic LoRA is not supported yet")
