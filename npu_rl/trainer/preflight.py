"""Checks on the file system that a run needs, done before anything heavy loads (``main_ppo`` and ``run``).

- ``trainer.default_local_dir`` must be a folder that can be made and written (not a file, not under a file, not
  ``/proc/...`` or a read-only mount); so must ``trainer.rollout_data_dir`` / ``validation_data_dir`` when set.
- ``trainer.project_name`` / ``experiment_name`` may not climb out of the run folder (``..``, an absolute path).
- When the run saves, the disk under ``default_local_dir`` has at least the model's weights free (a full-weight
  checkpoint is bigger still).
- A ``default_local_dir`` that already holds checkpoints is never overwritten silently: with
  ``trainer.resume_mode=disable`` the run is refused, naming the folder and the three ways on (resume, another
  folder, or ``trainer.overwrite_checkpoints=True``, which removes the old steps and marker first).
"""

from __future__ import annotations

import os
import sys

from npu_rl.trainer.checkpoint import MARKER, checkpoint_space_problem, remove_path, saved_steps, step_dir
from npu_rl.utils.paths import check_name_component, check_output_dir


def run_folder_problems(config) -> list[str]:
    """What is wrong with the run folder for this config (empty: nothing)."""
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
    from npu_rl.config.errors import ConfigError

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
