"""Checks that run before anything heavy starts. Every problem is collected and reported at once, each naming the
key and what to change. Registries (estimators, losses, KL types, reward managers) are asked directly, so a
plug-in path is loaded and checked here too.
"""

from __future__ import annotations

import os
from typing import Callable

from npu_rl.config.derived import as_list, critic_enabled, plan_problems
from npu_rl.config.errors import ConfigError
from npu_rl.config.schema import PPOConfig

TRUNCATION_MODES = ("error", "left", "right", "middle")
ROLLOUT_ENGINES = ("vllm", "hf")
STRATEGIES = ("fsdp", "fsdp2")
RESUME_MODES = ("auto", "disable", "resume_path")
CONTROLLERS = ("auto", "local", "ray")
KL_CONTROLLERS = ("fixed", "adaptive")
LOGGERS = ("console", "file", "jsonl", "tensorboard", "wandb", "swanlab", "mlflow", "trackio", "clearml")
FILTER_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")
SCHEDULERS = ("constant", "cosine")
KERNEL_BACKENDS = ("torch", "triton", "triton_mm", "auto")
DTYPES = ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16")


class _Checker:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def require(self, ok: bool, message: str) -> None:
        if not ok:
            self.problems.append(message)

    def choice(self, key: str, value, choices) -> None:
        self.require(value in choices, f"{key}={value!r} is not one of {', '.join(map(str, choices))}")

    def attempt(self, fn: Callable[[], object], prefix: str = "") -> None:
        """Run a check that raises (a registry lookup, a file load) and keep its message."""
        try:
            fn()
        except (ValueError, TypeError, ImportError, AttributeError, FileNotFoundError, OSError) as exc:
            message = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
            self.problems.extend(prefix + m for m in message)


def _check_choices(c: _Checker, config: PPOConfig) -> None:
    arr = config.actor_rollout_ref
    c.choice("data.truncation", config.data.truncation, TRUNCATION_MODES)
    c.choice("actor_rollout_ref.rollout.name", arr.rollout.name, ROLLOUT_ENGINES)
    c.choice("actor_rollout_ref.actor.strategy", arr.actor.strategy, STRATEGIES)
    c.choice("critic.strategy", config.critic.strategy, STRATEGIES)
    c.choice("reward_model.strategy", config.reward_model.strategy, STRATEGIES)
    c.choice("trainer.resume_mode", config.trainer.resume_mode, RESUME_MODES)
    c.choice("trainer.controller", config.trainer.controller, CONTROLLERS)
    c.choice("algorithm.kl_ctrl.type", config.algorithm.kl_ctrl.type, KL_CONTROLLERS)
    c.choice("actor_rollout_ref.model.fused_kernel_options.impl_backend",
             arr.model.fused_kernel_options.impl_backend, KERNEL_BACKENDS)
    for key, optim in (("actor_rollout_ref.actor.optim", arr.actor.optim), ("critic.optim", config.critic.optim)):
        c.choice(f"{key}.lr_scheduler_type", optim.warmup_style or optim.lr_scheduler_type, SCHEDULERS)
        c.require(optim.lr >= 0, f"{key}.lr={optim.lr} must be >= 0")
        c.require(optim.optimizer.lower() in ("adamw", "adam"), f"{key}.optimizer={optim.optimizer!r}: only AdamW")
    for key, fsdp in (("actor_rollout_ref.actor.fsdp_config", arr.actor.fsdp_config),
                      ("critic.model.fsdp_config", config.critic.model.fsdp_config)):
        c.choice(f"{key}.model_dtype", fsdp.model_dtype, DTYPES)
        c.choice(f"{key}.mixed_precision.param_dtype", fsdp.mixed_precision.param_dtype, DTYPES)
    for name in as_list(config.trainer.logger):
        c.choice("trainer.logger", name, LOGGERS)
    from npu_rl.tracking.backends import check_trackers

    c.problems.extend(check_trackers([str(n) for n in as_list(config.trainer.logger)]))
    if config.trainer.resume_mode == "resume_path":
        c.require(bool(config.trainer.resume_from_path),
                  "trainer.resume_mode=resume_path needs trainer.resume_from_path=<checkpoint folder>")
    _check_lora(c, config)
    c.require(not arr.model.use_liger, "actor_rollout_ref.model.use_liger: Liger is not supported (and not on NPU); "
              "use actor_rollout_ref.model.use_fused_kernels=True")


def _check_lora(c: _Checker, config: PPOConfig) -> None:
    from npu_rl.models.lora import LoraSpec, check_spec

    for problem in check_spec(LoraSpec.from_config(config.actor_rollout_ref.model)):
        c.problems.append(problem)
    critic = LoraSpec.from_config(config.critic.model, key="critic.model")
    c.require(not critic.enabled or not critic_enabled(config), "critic.model.lora_rank > 0: LoRA on the critic is "
              "not supported yet (the actor's is: actor_rollout_ref.model.lora_rank); set critic.model.lora_rank=0")
    c.require(not (critic.adapter_path and critic_enabled(config)),
              "critic.model.lora_adapter_path is set but critic LoRA is not supported yet")


def _check_numbers(c: _Checker, config: PPOConfig) -> None:
    actor = config.actor_rollout_ref.actor
    rollout = config.actor_rollout_ref.rollout
    c.require(actor.clip_ratio_c > 1.0, f"actor_rollout_ref.actor.clip_ratio_c={actor.clip_ratio_c} must be > 1 "
              "(it is the dual-clip bound on the ratio for negative advantages; verl's default is 3.0)")
    for key in ("clip_ratio", "clip_ratio_low", "clip_ratio_high", "entropy_coeff", "kl_loss_coef", "grad_clip"):
        value = getattr(actor, key)
        c.require(value is None or value >= 0, f"actor_rollout_ref.actor.{key}={value} must be >= 0")
    c.require(config.critic.cliprange_value >= 0, "critic.cliprange_value must be >= 0")
    c.require(actor.ppo_epochs >= 1, f"actor_rollout_ref.actor.ppo_epochs={actor.ppo_epochs} must be >= 1")
    c.require(rollout.n >= 1, f"actor_rollout_ref.rollout.n={rollout.n} must be >= 1")
    c.require(rollout.val_kwargs.n >= 1, "actor_rollout_ref.rollout.val_kwargs.n must be >= 1")
    c.require(0 < rollout.gpu_memory_utilization <= 1,
              f"actor_rollout_ref.rollout.gpu_memory_utilization={rollout.gpu_memory_utilization} must be in (0, 1]")
    for key, value in (("temperature", rollout.temperature), ("val_kwargs.temperature", rollout.val_kwargs.temperature)):
        c.require(value >= 0, f"actor_rollout_ref.rollout.{key}={value} must be >= 0")
    c.require(0 < rollout.top_p <= 1, f"actor_rollout_ref.rollout.top_p={rollout.top_p} must be in (0, 1]")
    c.require(rollout.top_k == -1 or rollout.top_k >= 0, "actor_rollout_ref.rollout.top_k must be -1 (off) or >= 0")
    c.require(rollout.sleep_level in (1, 2), "actor_rollout_ref.rollout.sleep_level must be 1 or 2")
    data = config.data
    c.require(data.max_prompt_length > 0, "data.max_prompt_length must be > 0")
    c.require(data.max_response_length > 0, "data.max_response_length must be > 0")
    c.require(data.train_batch_size > 0 or config.async_training.mode == "fully_async",
              "data.train_batch_size must be > 0 (0 streams: the fully asynchronous trainer only)")
    if data.gen_batch_size is not None:
        c.require(data.gen_batch_size > 0, "data.gen_batch_size must be > 0")
    fg = config.algorithm.filter_groups
    if fg.enable:
        c.require(fg.metric in FILTER_METRICS, f"algorithm.filter_groups.enable=True needs algorithm.filter_groups."
                  f"metric set to one of {', '.join(FILTER_METRICS)} (got {fg.metric!r})")
        c.require(fg.max_num_gen_batches >= 0, "algorithm.filter_groups.max_num_gen_batches must be >= 0 (0: no limit)")
    tr = config.trainer
    c.require(tr.total_epochs >= 1, f"trainer.total_epochs={tr.total_epochs} must be >= 1")
    if tr.total_training_steps is not None:
        c.require(tr.total_training_steps >= 1, "trainer.total_training_steps must be >= 1 (or null)")
    c.require(tr.nnodes >= 1 and tr.n_gpus_per_node >= 1, "trainer.nnodes and trainer.n_gpus_per_node must be >= 1")
    kl = config.algorithm.kl_ctrl
    if kl.type == "adaptive":
        c.require(kl.horizon > 0 and kl.target_kl > 0, "algorithm.kl_ctrl: adaptive needs horizon > 0, target_kl > 0")


def _estimator_resolves(config: PPOConfig) -> bool:
    """Whether ``algorithm.adv_estimator`` names an estimator (an unknown one is reported by the registry check;
    the checks that depend on what it needs are skipped until it resolves)."""
    from npu_rl.core import ADV_ESTIMATORS

    try:
        ADV_ESTIMATORS.get(config.algorithm.adv_estimator)
    except (ValueError, TypeError, ImportError, AttributeError, OSError):
        return False
    return True


def _check_batch_sizes(c: _Checker, config: PPOConfig) -> None:
    if _estimator_resolves(config):
        c.problems.extend(plan_problems(config))


def _check_registries(c: _Checker, config: PPOConfig) -> None:
    from npu_rl.core import ADV_ESTIMATORS, LOSS_AGG_MODES, POLICY_LOSSES, check_kl_type

    arr = config.actor_rollout_ref
    c.attempt(lambda: ADV_ESTIMATORS.check(config.algorithm.adv_estimator))
    c.attempt(lambda: POLICY_LOSSES.check(arr.actor.policy_loss.loss_mode))
    c.choice("actor_rollout_ref.actor.loss_agg_mode", arr.actor.loss_agg_mode, LOSS_AGG_MODES)
    _check_estimator_inputs(c, config)
    if _estimator_resolves(config) and critic_enabled(config):
        c.choice("critic.loss_agg_mode", config.critic.loss_agg_mode, LOSS_AGG_MODES)
    for used, key, value in ((arr.actor.use_kl_loss, "actor_rollout_ref.actor.kl_loss_type", arr.actor.kl_loss_type),
                             (config.algorithm.use_kl_in_reward, "algorithm.kl_penalty", config.algorithm.kl_penalty)):
        if not used:
            continue
        c.attempt(lambda: check_kl_type(value), f"{key}: ")
        c.require(value.rstrip("+") != "full", f"{key}={value!r}: the full-vocabulary KL exists as a kernel "
                  "(npu_rl.kernels.full_vocab_kl) but the trainer does not feed it the reference's hidden states yet; "
                  "use low_var_kl (k3), kl (k1) or mse (k2)")
    from npu_rl.reward import check_reward_config

    c.attempt(lambda: check_reward_config(config.reward_model, config.custom_reward_function, config.data))
    from npu_rl.config.rollout_correction import check_rollout_correction

    c.problems.extend(check_rollout_correction(config))


def _check_estimator_inputs(c: _Checker, config: PPOConfig) -> None:
    """What the newer estimators / losses need that the trainer does not produce on its own."""
    from npu_rl.core import estimator_needs

    algo, actor = config.algorithm, config.actor_rollout_ref.actor
    if _estimator_resolves(config) and "sum_pi_squared" in estimator_needs(algo.adv_estimator):
        c.require(actor.calculate_sum_pi_squared, f"algorithm.adv_estimator={algo.adv_estimator!r} needs "
                  "actor_rollout_ref.actor.calculate_sum_pi_squared=True (the actor then computes sum_v pi_v^2 per "
                  "token with the old log-probs), as in verl")
    if actor.calculate_sum_pi_squared:
        c.require(not config.actor_rollout_ref.model.use_fused_kernels, "actor_rollout_ref.actor.calculate_sum_pi_"
                  "squared=True is computed on the plain log-prob path; the fused kernels do not produce it: set "
                  "actor_rollout_ref.model.use_fused_kernels=False")
    if algo.adv_estimator == "gdpo":
        keys, weights = as_list(algo.gdpo_reward_keys), algo.gdpo_reward_weights
        c.require(bool(keys), "algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys: the reward components "
                  "(keys of the dict your compute_score returns), e.g. '[accuracy_reward,format_reward]'")
        if weights is not None:
            c.require(len(as_list(weights)) == len(keys), f"algorithm.gdpo_reward_weights has {len(as_list(weights))} "
                      f"entries for {len(keys)} algorithm.gdpo_reward_keys")
    if actor.policy_loss.loss_mode == "dro":
        beta = actor.policy_loss.dro_beta
        c.require(beta is not None and beta > 0, f"actor_rollout_ref.actor.policy_loss.loss_mode=dro needs "
                  f"actor_rollout_ref.actor.policy_loss.dro_beta > 0 (got {beta})")


def _check_paths(c: _Checker, config: PPOConfig) -> None:
    from npu_rl.models.loader import resolve_model_path

    for key in ("train_files", "val_files"):
        files = as_list(getattr(config.data, key))
        c.require(bool(files), f"data.{key} is empty")
        for path in files:
            c.attempt(lambda: _require_data_file(key, str(path)))
    c.attempt(lambda: _check_model_path(config.actor_rollout_ref.model.path), "actor_rollout_ref.model.path: ")
    if config.actor_rollout_ref.model.lora_rank > 0:
        from npu_rl.models.lora import check_against_model

        c.attempt(lambda: check_against_model(config.actor_rollout_ref.model))
    if _estimator_resolves(config) and critic_enabled(config):
        c.attempt(lambda: _check_model_path(config.critic.model.path), "critic.model.path: ")
    if config.reward_model.enable:
        c.attempt(lambda: resolve_model_path(config.reward_model.model.path), "reward_model.model.path: ")


def _require_data_file(key: str, path: str) -> None:
    try:
        ok = data_file_exists(path)
    except ValueError as exc:
        raise ValueError(f"data.{key}: {exc}") from exc
    if not ok and os.path.isdir(os.path.expanduser(path)):
        raise IsADirectoryError(f"data.{key}: {path!r} is a folder; give the parquet/jsonl file inside it")
    if not ok:
        raise FileNotFoundError(f"data.{key}: file {path!r} does not exist (run `npu-rl preprocess gsm8k` or point the "
                                "key at a parquet/jsonl file)")


def data_file_exists(path: str) -> bool:
    """A data file on disk, or a valid built-in data set (``builtin://arith/train``, generated on first use)."""
    if path.startswith("builtin://"):
        from npu_rl.data.builtin import check_builtin

        check_builtin(path)  # raises naming what is wrong with the URI
        return True
    if path.startswith("hf://"):
        return True  # resolved (downloaded on this explicit request, or read from the cache) when the data loads
    expanded = os.path.expanduser(path)
    if os.path.isdir(expanded):
        from npu_rl.data.io import is_hf_dataset_dir

        if not is_hf_dataset_dir(expanded):
            raise ValueError(f"{path!r} is a folder but not one written by datasets' save_to_disk (no state.json + "
                             "dataset_info.json); give a parquet/jsonl file or a save_to_disk folder")
        return True
    return os.path.isfile(expanded)


def _check_model_path(path: str) -> None:
    from npu_rl.models.loader import is_builtin, resolve_model_path

    if not is_builtin(path):  # a built-in model is converted on first use; don't do that at validation
        resolve_model_path(path)


def _check_device(c: _Checker, config: PPOConfig) -> None:
    from npu_rl.device import select_backend

    requested = config.trainer.device
    if requested != "auto" or os.environ.get("DEVICE"):
        requested = requested if requested != "auto" else None
    try:
        backend = select_backend(requested if requested else None)
    except (RuntimeError, ValueError) as exc:
        c.problems.append(f"trainer.device: {exc}")
        return
    from npu_rl.trainer.profiling import check_profiler_config

    c.problems.extend(check_profiler_config(config, backend.name))
    if backend.is_accelerator and config.trainer.nnodes == 1:
        have = backend.device_count()
        c.require(config.trainer.n_gpus_per_node <= have,
                  f"trainer.n_gpus_per_node={config.trainer.n_gpus_per_node} but only {have} {backend.name} "
                  f"device(s) are visible ({backend.visible_devices_env}={os.environ.get(backend.visible_devices_env)})")


def validate(config: PPOConfig, check_paths: bool = True, check_device: bool = True) -> None:
    """Raise ConfigError listing every problem in ``config``."""
    c = _Checker()
    _check_choices(c, config)
    _check_numbers(c, config)
    _check_batch_sizes(c, config)
    _check_registries(c, config)
    from npu_rl.agent.validate import agent_config_problems

    c.problems.extend(agent_config_problems(config, check_paths))
    if check_paths:
        _check_paths(c, config)
    from npu_rl.config.fault_checks import check_faults

    c.problems += check_faults(config, check_paths)
    from npu_rl.config.async_schema import async_problems

    c.problems += async_problems(config)
    if check_device:
        _check_device(c, config)
    if c.problems:
        raise ConfigError(c.problems)


# Keys kept so that verl scripts run unchanged, but with no effect here (a non-default value gets a note).
NO_EFFECT = {
    "actor_rollout_ref.hybrid_engine": "actor, rollout and reference always share the devices (a separate rollout "
                                       "pool is the asynchronous trainers', docs/async.md)",
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking": "entropy is always computed in row chunks or fused",
    "actor_rollout_ref.actor.entropy_checkpointing": "entropy is always computed in row chunks or fused",
    "actor_rollout_ref.rollout.layered_summon": "weights are always streamed one parameter at a time",
    "actor_rollout_ref.model.enable_activation_offload": "activation offload is not implemented",
    "actor_rollout_ref.model.external_lib": "import your model code yourself (trust_remote_code works)",
    "critic.model.external_lib": "import your model code yourself (trust_remote_code works)",
    "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params": "FSDP2 shards per decoder layer",
    "reward_model.launch_reward_fn_async": "rewards are computed synchronously (a process pool with num_workers)",
    "trainer.default_hdfs_dir": "no HDFS copy; checkpoints stay in trainer.default_local_dir",
    "trainer.del_local_ckpt_after_load": "checkpoints are kept (use trainer.max_actor_ckpt_to_keep)",
    "actor_rollout_ref.model.use_shm": "the model folder is read where it is (no copy to /dev/shm)",
    "critic.model.use_shm": "the model folder is read where it is (no copy to /dev/shm)",
    "reward_model.ulysses_sequence_parallel_size": "the reward model forward is data-parallel only",
    "reward_model.use_dynamic_bsz": "the reward model scores fixed-size micro-batches (micro_batch_size_per_gpu)",
    "reward_model.forward_max_token_len_per_gpu": "the reward model scores fixed-size micro-batches",
    "reward_model.model.use_remove_padding": "the reward model runs on padded rows",
    "data.tokenizer": "the tokenizer is actor_rollout_ref.model.path's",
    "data.return_raw_input_ids": "the reward model re-tokenizes the decoded text with its own tokenizer",
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype": "buffers keep the dtype they load with",
    "actor_rollout_ref.ref.fsdp_config.mixed_precision.buffer_dtype": "buffers keep the dtype they load with",
    "critic.model.fsdp_config.mixed_precision.buffer_dtype": "buffers keep the dtype they load with",
    "reward_model.model.fsdp_config.mixed_precision.buffer_dtype": "buffers keep the dtype they load with",
}


def ignored_settings(config: PPOConfig, baseline: PPOConfig | None = None) -> list[str]:
    """Notes for keys set to a non-default value that have no effect here. ``baseline``: the config the user started
    from (a config file we ship, before their overrides), so only what the user changed gets a note."""
    from omegaconf import OmegaConf

    from npu_rl.config.schema import PPOConfig as Schema

    defaults = OmegaConf.structured(baseline if baseline is not None else Schema)
    current = OmegaConf.structured(config)
    notes = []
    for key, why in NO_EFFECT.items():
        if key == "actor_rollout_ref.hybrid_engine" and config.async_training.mode != "sync":
            continue  # the asynchronous trainers read it (config/async_schema.py)
        value = OmegaConf.select(current, key)
        default = OmegaConf.select(defaults, key, throw_on_resolution_failure=False)
        if value != default:
            notes.append(f"{key}={value!r} has no effect in npu-rl: {why}")
    from npu_rl.config.async_schema import async_notes

    notes += async_notes(config, defaults, current)
    tokenizer_path = config.critic.model.tokenizer_path
    if tokenizer_path not in (None, config.actor_rollout_ref.model.path):
        notes.append(f"critic.model.tokenizer_path={tokenizer_path!r} has no effect in npu-rl: the critic scores the "
                     "actor's tokens with the actor's tokenizer")
    return notes
