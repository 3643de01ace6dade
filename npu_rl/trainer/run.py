"""Build everything a run needs from a validated config, train, and say where the results are."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import time

from npu_rl.agent.validate import agent_row_problems
from npu_rl.config.derived import RunSettings, as_list, world_size
from npu_rl.config.errors import ConfigError
from npu_rl.config.schema import PPOConfig
from npu_rl.controller.ray_group import RayWorkerGroup, ResourcePool
from npu_rl.controller.worker_group import LocalWorkerGroup
from npu_rl.controller.worker_group import use_ray as controller_uses_ray
from npu_rl.data.loader import build_dataloader
from npu_rl.models.vision import vision_inputs_for
from npu_rl.device import get_backend
from npu_rl.device.npu_env import worker_process_env
from npu_rl.models.loader import load_tokenizer
from npu_rl.reward import build_reward_manager
from npu_rl.tracking import Tracker
from npu_rl.tracking.plot import plot_runs
from npu_rl.tracking.run_record import recorded_config, save_run_record
from npu_rl.trainer.async_rollouts import build_rollouts
from npu_rl.trainer.checkpoint import latest_step, step_dir
from npu_rl.trainer.interrupt import resume_command
from npu_rl.trainer.ppo_trainer import PPOTrainer, Roles, total_training_steps
from npu_rl.trainer.preflight import check, run_settings_for, prepare_run_folder
from npu_rl.trainer.sampling import PromptStream
from npu_rl.utils.redact import install_log_redaction
from npu_rl.trainer.teachers import TeacherRouter
from npu_rl.workers.roles import own_pools, teacher_roles, worker_specs

logger = logging.getLogger(__name__)


def use_ray(config: PPOConfig) -> bool:
    return controller_uses_ray(config.trainer.controller, world_size(config))


def _start_ray(config: PPOConfig) -> None:
    import ray

    if not ray.is_initialized():
        init = config.ray_kwargs.ray_init
        ray.init(**{k: v for k, v in dataclasses.asdict(init).items() if v not in (None, {})})


def build_worker_group(config: PPOConfig, run_settings: RunSettings):
    """The roles on the trainer's devices (hybrid engine: one group, one process per device); the roles that run on
    devices of their own (:func:`own_pools`) are left to :func:`build_pool_groups`."""
    pooled = own_pools(config)
    roles = {name: spec for name, spec in worker_specs(config, run_settings).items() if name not in pooled}
    if not use_ray(config):
        return LocalWorkerGroup(roles)
    _start_ray(config)
    pool = ResourcePool.from_trainer_config(config.trainer.nnodes, config.trainer.n_gpus_per_node)
    rollout = config.actor_rollout_ref.rollout
    sleep_mode = rollout.name == "vllm" and bool(rollout.free_cache_engine)
    return RayWorkerGroup(pool, roles, process_env=worker_process_env(get_backend().name, sleep_mode=sleep_mode),
                          seed=config.trainer.seed, owns_pool=True)


def build_pool_groups(config: PPOConfig, run_settings: RunSettings) -> dict:
    """``{role: group}`` for the frozen roles on devices of their own (verl's teacher_pool / reward_pool): each its
    own Ray worker group on its own placement groups (one process per device, a process group of its own, so FSDP2
    shards the model over the pool's ranks only; on CPU, processes holding CPUs). Always Ray, whatever
    trainer.controller says about the trainer's own group."""
    specs = worker_specs(config, run_settings)
    by_pool: dict = {}  # the roles of one pool share its group (several teachers: each sharded over all of it)
    for name, pool in own_pools(config).items():
        if name in specs:
            by_pool.setdefault(pool, {})[name] = specs[name]
    groups = {}
    if by_pool:
        _start_ray(config)
    try:
        for spec, roles in by_pool.items():
            pool = ResourcePool([spec.n_gpus_per_node] * spec.nnodes, name=f"npu_rl_{spec.key}_pool")
            judge = config.reward_model.rollout
            sleep_mode = "judge" in roles and judge.name == "vllm" and bool(judge.free_cache_engine)
            group = RayWorkerGroup(pool, roles, name=f"npu_rl_{spec.key}",
                                   process_env=worker_process_env(get_backend().name, sleep_mode=sleep_mode),
                                   seed=config.trainer.seed, owns_pool=True)
            groups |= {name: group for name in roles}
    except BaseException:
        close_groups(distinct(groups.values()))
        raise
    return groups


def distinct(groups) -> list:
    """Each group once, in first-seen order (the roles of one pool share its group)."""
    return list({id(group): group for group in groups}.values())


def close_groups(groups) -> None:
    """Stop each group's workers and give its devices back (a group that owns its pool); a group that fails to stop
    does not keep the others running: the first such error is raised once every group was asked."""
    errors = []
    for group in groups:
        try:
            group.shutdown()
        except Exception as exc:  # noqa: BLE001 - raised below, after the other groups
            errors.append(exc)
    if errors:
        raise errors[0]


def stop_on_exit(stack: contextlib.ExitStack, close, *args) -> None:
    """``close(*args)`` when ``stack`` exits, whichever way. When an error is already on its way out, a failure to
    close is logged rather than raised over it, so the run fails with the error that stopped it."""

    def exit_(exc_type, exc, tb) -> bool:
        try:
            close(*args)
        except Exception:
            if exc is None:
                raise
            logger.exception("while stopping after %s: %s failed", type(exc).__name__,
                             getattr(close, "__name__", close))
        return False

    stack.push(exit_)


def write_ray_timeline(config: PPOConfig) -> str | None:
    """``ray_kwargs.timeline_json_file``: write Ray's task timeline (``ray.timeline()``) there, as verl does after
    training; nothing when unset or when Ray is not running (the local controller). Returns the path written."""
    path = config.ray_kwargs.timeline_json_file
    if not path:
        return None
    import ray

    if not ray.is_initialized():
        logging.getLogger(__name__).warning("ray_kwargs.timeline_json_file=%s: Ray is not running (local "
                                            "controller), so there is no timeline to write", path)
        return None
    path = os.path.abspath(os.path.expanduser(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ray.timeline(filename=path)
    print(f"npu-rl: Ray timeline -> {path}", file=sys.stderr)
    return path


def check_rows(config: PPOConfig, datasets) -> None:
    """What the data rows ask for that the config does not offer (an agent loop or interaction by name), before any
    model loads; a row never names code to run."""
    problems = agent_row_problems(config, [(where, row) for ds in datasets for where, row in zip(ds.sources, ds.rows)])
    if problems:
        raise ConfigError(problems)


def run_dir_for(config: PPOConfig) -> str:
    """``logs/<time>`` under ``trainer.default_local_dir``. A run that resumes here (``resume_mode=auto`` with a
    checkpoint) continues the log folder of the run it resumes, so metrics.jsonl and the curves stay one run; rows
    logged after that checkpoint (then lost with the crash) are dropped, since the resumed run does those steps
    again."""
    root = os.path.abspath(os.path.expanduser(config.trainer.default_local_dir))
    fresh = os.path.join(root, "logs", time.strftime("%Y%m%d-%H%M%S"))
    checkpoint = latest_checkpoint(config)
    if config.trainer.resume_mode != "auto" or config.trainer.val_only or checkpoint is None:
        return fresh
    import glob

    earlier = sorted(glob.glob(os.path.join(root, "logs", "*", "metrics.jsonl")))
    if not earlier:
        return fresh
    _drop_rows_after(earlier[-1], int(os.path.basename(checkpoint).rpartition("_")[2]))
    return os.path.dirname(earlier[-1])


def _drop_rows_after(path: str, step: int) -> None:
    import json

    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    kept = [line for line in lines if json.loads(line).get("step", 0) <= step]
    if len(kept) != len(lines):
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(kept)
        os.replace(tmp, path)


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What a finished run produced (``npu_rl.Trainer.train`` returns it; the CLI uses ``exit_code``)."""

    exit_code: int
    global_step: int
    run_dir: str  # logs/<time>: metrics.jsonl, the run record, curves
    metrics_path: str
    checkpoint: str | None  # the newest saved step's folder (global_step_N), None when nothing was saved


def run(config: PPOConfig, argv: list[str] | None = None, checked: bool = False) -> int:
    """Train with ``config``; returns the exit code. The preflight's checks run first unless ``checked`` says the
    caller ran them (``load_checked``). ``argv``: the command line to record in the run folder (default
    ``sys.argv``)."""
    return train(config, argv, checked).exit_code


def latest_checkpoint(config: PPOConfig) -> str | None:
    """The newest saved step's folder under ``trainer.default_local_dir`` that exists, else None."""
    root = os.path.abspath(os.path.expanduser(config.trainer.default_local_dir))
    try:
        step = latest_step(root)
    except (OSError, ValueError):  # a marker naming a step that is not there: no checkpoint to name
        return None
    return step_dir(root, step) if step is not None else None


def train(config: PPOConfig, argv: list[str] | None = None, checked: bool = False) -> RunResult:
    """Train with ``config`` (checked first unless ``checked``); what the run produced."""
    if not checked:
        check(config)
    run_settings = run_settings_for(config)
    prepare_run_folder(config)  # before anything loads: a folder in the way or another run's checkpoints
    logging.basicConfig(level=os.environ.get("NPU_RL_LOG_LEVEL", "WARNING"), stream=sys.stderr)

    install_log_redaction()  # what the run logs never shows a secret (URL credentials, *_API_KEY values ...)
    backend = get_backend(None if config.trainer.device == "auto" else config.trainer.device)
    backend.manual_seed(config.trainer.seed)
    model_cfg = config.actor_rollout_ref.model
    tokenizer = load_tokenizer(model_cfg.path, model_cfg.trust_remote_code, model_cfg.custom_chat_template)
    vision = vision_inputs_for(model_cfg, config.data)  # a Qwen-VL actor's image side (docs/vl.md); None for text
    prompts = PromptStream(build_dataloader(config.data, tokenizer, "train", vision=vision))
    needs_val = config.trainer.val_before_train or config.trainer.test_freq > 0 or config.trainer.val_only
    val_loader = build_dataloader(config.data, tokenizer, "val", vision=vision) if needs_val else None
    check_rows(config, [prompts.loader.dataset] + ([val_loader.dataset] if val_loader is not None else []))
    reward_fn = build_reward_manager(config, tokenizer)
    val_reward_fn = build_reward_manager(config, tokenizer, validation=True) if needs_val else None

    with contextlib.ExitStack() as started:  # what starts here stops on the way out: finished, failed or Ctrl-C
        groups: list = []  # every worker group started, in start order; shut down by this stack
        stop_on_exit(started, close_groups, groups)
        groups.append(build_worker_group(config, run_settings))
        group = groups[0]
        pool_groups = build_pool_groups(config, run_settings)  # a teacher or reward model on devices of its own
        groups.extend(distinct(pool_groups.values()))
        total_steps = total_training_steps(config, prompts.batches_per_epoch)
        roles = init_roles(config, run_settings, group, pool_groups, total_steps)

        run_dir = run_dir_for(config)
        save_run_record(run_dir, config, argv)
        tracker = Tracker(as_list(config.trainer.logger), config.trainer.project_name,
                          config.trainer.experiment_name, run_dir,
                          recorded_config(config),  # secrets masked: trackers store what they are given
                          console_keys=config.trainer.console_keys)
        stop_on_exit(started, tracker.close)
        print(f"npu-rl: device {backend.name}, {world_size(config)} device(s); metrics -> {tracker.jsonl_path}; "
              f"checkpoints -> {os.path.abspath(config.trainer.default_local_dir)}", file=sys.stderr)

        rollouts = build_rollouts(config, run_settings, group, prompts)  # sync: the colocated engine; else a pool
        stop_on_exit(started, _close_rollouts, rollouts)
        trainer = PPOTrainer(config, run_settings, roles, prompts, val_loader, reward_fn, val_reward_fn, tracker,
                             backend, group.actor_rollout.model_config(), tokenizer, rollouts=rollouts)
        start = time.perf_counter()
        try:
            code = trainer.fit()
        except Exception as exc:
            if type(exc).__name__ != "WorkerLostError":  # npu_rl.controller.ray_group's (not imported without Ray)
                raise
            _worker_lost(config, exc)
            return 1
    checkpoint = latest_checkpoint(config)
    _summary(trainer, tracker.jsonl_path, time.perf_counter() - start, checkpoint)
    write_ray_timeline(config)
    if config.trainer.draw_curves:
        _draw_curves(run_dir)
    return RunResult(code, trainer.global_step, run_dir, tracker.jsonl_path, checkpoint)


def init_roles(config: PPOConfig, run_settings: RunSettings, group, pool_groups: dict, total_steps: int) -> Roles:
    """Load every role's model (``init_model``) in the started groups: the trainer's devices' and the pools'."""
    handles = {**{name: getattr(group, name) for name in group.role_names()},
               **{name: getattr(g, name) for name, g in pool_groups.items()}}
    teachers = teacher_roles(config)
    group.actor_rollout.init_model(total_steps)
    roles = Roles(actor_rollout=group.actor_rollout, num_devices=world_size(config))
    if "ref" in handles:
        group.ref.init_model()
        roles.ref = group.ref
    elif run_settings.ref_in_actor:
        roles.ref = group.actor_rollout
    if "critic" in handles:
        handles["critic"].init_model(total_steps)
        roles.critic = handles["critic"]
    for name in ("judge", "reward_model"):  # frozen: on the trainer's devices or on their own pool
        if name in handles:
            handles[name].init_model()
            setattr(roles, name, handles[name])
    for name in teachers:
        handles[name].init_model()
    if teachers:  # one teacher takes every row; several: each row goes to the teacher its routing field names
        roles.teacher = TeacherRouter({key: handles[name] for name, key in teachers.items()},
                                      config.distillation.teacher_key)
    if "prm" in handles:
        handles["prm"].init_model(total_steps)
        roles.prm = handles["prm"]
    return roles


def _close_rollouts(rollouts) -> None:
    closing = rollouts.close()  # asynchronous modes: the rollouter stops after its in-flight batch
    if closing:
        print(f"npu-rl: rollout pool closed ({', '.join(f'{k}={v:g}' for k, v in closing.items())})",
              file=sys.stderr)


def _worker_lost(config: PPOConfig, exc: Exception) -> None:
    """A rank died (a node went down): say so, where the last whole checkpoint is, and how to resume."""
    root = os.path.abspath(config.trainer.default_local_dir)
    try:
        step = latest_step(root)
        where = f"step {step} in {root}" if step is not None else f"none yet in {root}"
    except (OSError, ValueError) as marker_error:  # say what is wrong with it rather than hide the worker's death
        where = f"unreadable ({marker_error})"
    print(f"npu-rl: {exc}\nnpu-rl: the step in progress is lost; the last checkpoint is {where}. Once every node "
          f"is back (ray status), resume with:\n  {resume_command(['trainer.resume_mode=auto'])}",
          file=sys.stderr, flush=True)


def _draw_curves(run_dir: str) -> None:
    """curves.png / curves.html in the run folder (npu-rl plot); a failure to draw never fails the run."""
    try:
        png, page = plot_runs([run_dir])
        print(f"npu-rl: curves: {png} ({os.path.basename(page)} beside it; npu-rl plot RUN_DIR... compares runs)",
              file=sys.stderr)
    except ImportError:
        print("npu-rl: no curves drawn: matplotlib is not installed (pip install matplotlib; then npu-rl plot "
              f"{run_dir})", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - the training result stands; say why there is no picture
        print(f"npu-rl: no curves drawn: {type(exc).__name__}: {exc}", file=sys.stderr)


def _summary(trainer, jsonl_path: str, seconds: float, checkpoint: str | None) -> None:
    """The validation headline before and after, from the run's own metrics file: on stdout, with the step lines
    (the run's output; notes and warnings go to stderr)."""
    import json

    first, last = None, None
    if os.path.isfile(jsonl_path):
        with open(jsonl_path, encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                core = {k: v for k, v in row.items() if k.startswith("val-core/")}
                if core:
                    first = first or (row["step"], core)
                    last = (row["step"], core)
    print(f"npu-rl: finished step {trainer.global_step}/{trainer.total_steps} in {seconds:.0f} s")
    if first and last:
        for key in first[1]:
            print(f"npu-rl: {key}: {first[1][key]:.3f} (step {first[0]}) -> {last[1].get(key, float('nan')):.3f} "
                  f"(step {last[0]})")
    print(f"npu-rl: metrics: {jsonl_path}")
    if checkpoint is not None:  # the step saved last, which is not the last step run when save_freq skipped it
        print(f"npu-rl: checkpoints: {os.path.dirname(checkpoint)} (npu-rl merge {checkpoint} --out <dir> gives a "
              "Hugging Face folder)")
