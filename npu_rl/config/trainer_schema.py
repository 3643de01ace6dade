"""``trainer.*`` and ``ray_kwargs.*`` (verl's names): the run's length, devices, validation, checkpoints, logging and
the controller, and what ``ray.init`` is given. Part of the tree in ``npu_rl/config/schema.py``; each field's
description is the docstring under it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from npu_rl.config.rules import broken


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
