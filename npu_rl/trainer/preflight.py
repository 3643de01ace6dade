"""The preflight: everything a config must pass before anything heavy loads. Every entry point (``main_ppo`` /
``npu-rl train`` and its ``--cfg job``, :func:`npu_rl.trainer.run.run`, the commands that load a config) goes
through :func:`load_checked` or :func:`check`; every problem is collected and reported at once, each naming the key
and what to change.

- :func:`load_checked`: translate verl's keys (``npu_rl.compat.verl``), load (``npu_rl.config.loader.load_config``:
  compose and resolve, nothing else), build the plan, run every check; raises ``ConfigError`` listing every problem.
- :func:`check`: the checks of a loaded config: each slice's own rules (``check(key)`` in the schema), the plan's
  arithmetic (``npu_rl.config.derived.plan_problems``), the rules between keys, then what needs the rest of the
  house (:mod:`npu_rl.trainer.checks`: names, files, the device) and the agent loops' settings.
- :func:`run_settings_for`: the :class:`~npu_rl.config.derived.RunSettings`, with what it needs from the core (the estimator's
  declared inputs, the rollout-correction and distillation settings) passed in.
- The run folder: ``trainer.default_local_dir`` must be a folder that can be made and written (not a file, not
  under a file, not ``/proc/...`` or a read-only mount); so must ``trainer.rollout_data_dir`` /
  ``validation_data_dir`` when set. ``trainer.project_name`` / ``experiment_name`` may not climb out of the run
  folder (``..``, an absolute path). When the run saves, the disk under ``default_local_dir`` has at least the
  model's weights free (a full-weight checkpoint is bigger still). A ``default_local_dir`` that already holds
  checkpoints is never overwritten silently: with ``trainer.resume_mode=disable`` the run is refused, naming the
  folder and the three ways on (resume, another folder, or ``trainer.overwrite_checkpoints=True``, which removes the
  old steps and marker first).
"""

from __future__ import annotations

import dataclasses

import os
import sys

from npu_rl.agent.validate import agent_config_problems
from npu_rl.compat.verl.translate import translate_overrides
from npu_rl.config.derived import RunSettings, derive_run_settings, run_settings_problems
from npu_rl.config.errors import ConfigError
from npu_rl.config.loader import load_config
from npu_rl.config.rollout_correction import rollout_correction_problems
from npu_rl.config.rules import slice_problems
from npu_rl.config.schema import PPOConfig
from npu_rl.core import estimator_needs
from npu_rl.device import DeviceUnavailableError, select_backend
from npu_rl.trainer.checkpoint import MARKER, checkpoint_space_problem, remove_path, saved_steps, step_dir
from npu_rl.trainer.checks.device import device_problems
from npu_rl.trainer.checks.distillation import distillation_config_problems, distillation_spec, teacher_file_problems
from npu_rl.trainer.checks.files import file_problems
from npu_rl.trainer.checks.judge import judge_problems, uses_judge
from npu_rl.trainer.checks.prime import prime_config_problems, prime_notes, prime_spec
from npu_rl.trainer.checks.moe import rollout_expert_parallel_problems, router_replay_problems
from npu_rl.trainer.checks.names import estimator_resolves, name_problems
from npu_rl.trainer.checks.pools import pool_problems
from npu_rl.trainer.rollout_correction import correction_spec
from npu_rl.utils.paths import check_name_component, check_output_dir
from npu_rl.utils.redact import MASK, is_secret_name


def load_checked(overrides: list[str] | None = None, config_name: str = "ppo_trainer", config_path: str | None = None,
                 notes: list[str] | None = None, check_paths: bool = True, check_device: bool = True) -> PPOConfig:
    """Translate verl's keys (:func:`npu_rl.compat.verl.translate.translate_overrides`), load and check (see the
    module docstring). ``notes`` (a list) receives one line per verl key that was renamed, dropped or reinterpreted,
    and one per value the plan reads differently from the key as written."""
    config = load_embedded_aware(translate_overrides(list(overrides or []), notes), config_name, config_path, notes)
    run_settings = _plan(config, strict=False)
    check(config, run_settings, check_paths=check_paths, check_device=check_device)
    if notes is not None:
        notes.extend(run_settings.notes)
    return config


# The embedded defaults we ship compute in bf16, except on a CPU without native bf16 (no AVX512-BF16 / AMX), where
# bf16 is ~8x slower than fp32 (npu_rl.device.Backend.computes_bf16_natively): there they compute in fp32. A value
# the user sets for one of these keys, or a config of their own (--config-path), is never changed.
EMBEDDED_DEFAULTS = ("quickstart", "tool_quickstart")
HOST_DTYPE_KEYS = {
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype": "fp32",
    "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype": "fp32",
    "actor_rollout_ref.rollout.dtype": "float32",
}


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def host_dtype_overrides(config: PPOConfig, config_name: str, config_path: str | None,
                         overrides: list[str]) -> list[str]:
    """The overrides that make one of our embedded defaults compute in fp32 on a CPU without native bf16, or []."""
    if config_name not in EMBEDDED_DEFAULTS or config_path is not None:
        return []

    try:
        backend = select_backend(config.trainer.device if config.trainer.device != "auto" else None)
    except (DeviceUnavailableError, RuntimeError, ValueError):
        return []  # the device check reports it
    if backend.computes_bf16_natively():
        return []
    given = {_override_key(o) for o in overrides}
    return [f"{key}={value}" for key, value in HOST_DTYPE_KEYS.items() if key not in given]


def load_embedded_aware(overrides: list[str], config_name: str, config_path: str | None,
                        notes: list[str] | None) -> PPOConfig:
    """``load_config``, plus :func:`host_dtype_overrides` (said in a note) for an embedded default on such a CPU."""
    config = load_config(overrides, config_name, config_path, notes)
    extra = host_dtype_overrides(config, config_name, config_path, overrides)
    if not extra:
        return config
    if notes is not None:
        notes.append(f"this CPU computes bf16 without native support (no AVX512-BF16 or AMX: ~8x slower than fp32), "
                     f"so the embedded default {config_name!r} computes in fp32: {' '.join(extra)} (set them to bf16 "
                     "to keep bf16)")
    return load_config(extra + overrides, config_name, config_path)


def run_settings_for(config: PPOConfig) -> RunSettings:
    """The run settings of a (checked) config."""
    return _plan(config, strict=True)


def _plan(config: PPOConfig, strict: bool) -> RunSettings:
    """``strict=False``: for checking a config that may be wrong; what does not resolve (an unknown estimator, bad
    rollout-correction settings) is left out of the plan, and the checks report it."""
    needs = estimator_needs(config.algorithm.adv_estimator) if strict or estimator_resolves(config) else frozenset()
    rc, bypass = config.algorithm.rollout_correction, None
    if rc.bypass_mode:
        try:
            bypass = correction_spec(rc)
        except ValueError:
            if strict:
                raise
    settings = derive_run_settings(config, needs, bypass, distillation_spec(config), uses_judge(config),
                                   prime_spec(config))
    return dataclasses.replace(settings, notes=settings.notes + tuple(prime_notes(config)))


def check(config: PPOConfig, run_settings: RunSettings | None = None, check_paths: bool = True, check_device: bool = True) -> None:
    """Raise ConfigError listing every problem of ``config`` (``plan``: its plan, built here when not given).
    ``check_paths``: the files it reads and writes; ``check_device``: the device it asks for."""
    run_settings = run_settings or _plan(config, strict=False)
    problems = slice_problems(config)
    if estimator_resolves(config):
        problems += run_settings_problems(config, run_settings)
    problems += rollout_correction_problems(config)
    problems += name_problems(config, run_settings.use_critic)
    problems += agent_config_problems(config, check_paths)
    problems += router_replay_problems(config, check_paths)
    problems += rollout_expert_parallel_problems(config, check_device)
    problems += distillation_config_problems(config)
    problems += judge_problems(config)
    problems += pool_problems(config)
    problems += prime_config_problems(config)
    if check_paths:
        problems += file_problems(config, run_settings.use_critic)
        problems += teacher_file_problems(config)
        problems += run_folder_problems(config)
    if check_device:
        problems += device_problems(config)
    if problems:
        raise ConfigError(problems)


# Keys whose value becomes a folder name or a tracker's run name: written in plain text wherever a path is
PATH_NAME_KEYS = ("project_name", "experiment_name", "default_local_dir", "rollout_data_dir", "validation_data_dir")
MIN_SECRET_CHARS = 8  # shorter values of secret-named variables are not looked for (a "1" would match everything)


def secret_path_problems(config, environ=None) -> list[str]:
    """Keys of ``PATH_NAME_KEYS`` holding the value of a secret-named environment variable (``*_API_KEY``,
    ``*_TOKEN``, ``*SECRET*``, ``*PASSWORD*``), however it got there (``${oc.env:WANDB_API_KEY}``, a shell's
    ``$WANDB_API_KEY``, an interpolation of a key holding it): named, the variable named, the value never shown.
    Masking cannot help here (a folder named <redacted> would be every run's); a variable of another name
    (``${oc.env:RUN_NAME}``, ``${oc.env:USER}``) is taken as a name, as written."""
    environ = os.environ if environ is None else environ
    secrets = {name: value for name, value in environ.items()  # (a secret-named variable that holds a path,
               if is_secret_name(name) and len(value.strip()) >= MIN_SECRET_CHARS  # SECRETS_DIR=/home/me, is not one)
               and not os.path.exists(os.path.expanduser(value.strip()))}
    problems = []
    for key in PATH_NAME_KEYS:
        value = getattr(config.trainer, key, None)
        name = next((n for n, secret in secrets.items() if isinstance(value, str) and secret.strip() in value), None)
        if name is not None:
            problems.append(f"trainer.{key} holds the value of the environment variable {name} ({MASK}), a secret: "
                            "as a folder name or a tracker's run name it would be written in plain text on disk, in "
                            "every path printed and in the trackers. Give a name that is not a secret")
    return problems


def run_folder_problems(config) -> list[str]:
    """What is wrong with the run folder for this config (empty: nothing)."""
    secrets = secret_path_problems(config)
    if secrets:  # before any check whose message would show the path, and before anything is made there
        return secrets
    trainer = config.trainer
    if not isinstance(trainer.default_local_dir, str) or not trainer.default_local_dir.strip() \
            or "\0" in trainer.default_local_dir:
        return [f"trainer.default_local_dir={trainer.default_local_dir!r} is not a folder path"]
    problems = []
    for key in ("project_name", "experiment_name"):
        try:
            check_name_component(getattr(trainer, key), f"trainer.{key}")
        except ValueError as exc:
            problems.append(str(exc))
    for key in ("rollout_data_dir", "validation_data_dir"):
        if getattr(trainer, key):
            try:
                check_output_dir(getattr(trainer, key), f"trainer.{key}")
            except (OSError, ValueError) as exc:
                problems.append(str(exc))
    try:
        root = check_output_dir(trainer.default_local_dir, "trainer.default_local_dir")
    except (OSError, ValueError) as exc:
        return problems + [str(exc)]
    saves = trainer.save_freq > 0 or trainer.save_on_interrupt
    model = config.actor_rollout_ref.model
    space = checkpoint_space_problem(root, model.path, int(model.lora_rank) > 0) if saves and not trainer.val_only \
        else None
    if space:
        problems.append(space)
    if problems:
        return problems
    if trainer.resume_mode not in ("disable",) or trainer.val_only or trainer.overwrite_checkpoints:
        return []
    steps = saved_steps(root)
    if not steps and not os.path.isfile(os.path.join(root, MARKER)):
        return []
    held = f"checkpoints of steps {steps}" if steps else f"a {MARKER}"
    return [f"trainer.default_local_dir={root} already holds {held} of another run, and trainer.resume_mode=disable "
            "would overwrite them. Choose one: trainer.resume_mode=auto (continue that run), another "
            "trainer.default_local_dir (keep both), or trainer.overwrite_checkpoints=True (remove them and start "
            "over)"]


def check_run_folder(config) -> None:
    problems = run_folder_problems(config)
    if problems:
        raise ConfigError(problems)


def prepare_run_folder(config) -> None:
    """Check, then (``overwrite_checkpoints`` with ``resume_mode=disable``) remove the old checkpoints."""
    check_run_folder(config)
    trainer = config.trainer
    root = os.path.abspath(os.path.expanduser(trainer.default_local_dir))
    if trainer.resume_mode == "disable" and trainer.overwrite_checkpoints and not trainer.val_only:
        steps = saved_steps(root)
        for step in steps:
            remove_path(step_dir(root, step))  # a linked step folder: the link goes, not what it points at
        if os.path.isfile(os.path.join(root, MARKER)):
            os.remove(os.path.join(root, MARKER))
        if steps:
            print(f"npu-rl: trainer.overwrite_checkpoints=True: removed the checkpoints of steps {steps} from {root}",
                  file=sys.stderr)
