"""Validation checks for inputs that used to fail late or silently (issue 19's probe): each problem names the key,
the file and the row. Called from ``validate``; returns the problems, raises nothing. File-system checks only with
``check_paths``.

- ``trainer.max_consecutive_nan_steps`` must be >= 1 (0 stopped a healthy run at step 1 claiming a NaN).
- ``trainer.default_local_dir`` must be a folder that can be made and written.
- model folders: tokenizer files present, weights present and not truncated (``npu_rl.models.check``).
- data files, when the default rule scorers score them (no ``custom_reward_function.path``, no reward model): every
  row's ``data_source`` has a scorer, and its ground truth is text or a number (a list / dict / bool compared as text
  scores 0 for ever).
"""

from __future__ import annotations

import os
from typing import Any

MAX_LISTED = 3


def check_faults(config, check_paths: bool = True) -> list[str]:
    problems: list[str] = []
    trainer = config.trainer
    if int(trainer.max_consecutive_nan_steps) < 1:
        problems.append(f"trainer.max_consecutive_nan_steps={trainer.max_consecutive_nan_steps} must be >= 1 (the "
                        "number of non-finite steps in a row that stops the run)")
    if not check_paths:
        return problems
    from npu_rl.utils.paths import check_output_dir

    try:
        check_output_dir(str(trainer.default_local_dir), "trainer.default_local_dir")
    except (OSError, ValueError) as exc:
        problems.append(str(exc))
    problems += _model_problems(config)
    problems += _data_problems(config)
    return problems


def _model_problems(config) -> list[str]:
    from npu_rl.config.derived import critic_enabled
    from npu_rl.models.check import model_path_problems
    from npu_rl.models.loader import is_builtin

    keys = [("actor_rollout_ref.model.path", config.actor_rollout_ref.model.path, True)]
    if critic_enabled(config):
        keys.append(("critic.model.path", config.critic.model.path, False))
    problems = []
    for key, path, need_tokenizer in keys:
        folder = os.path.expanduser(str(path))
        if is_builtin(str(path)) or not os.path.isfile(os.path.join(folder, "config.json")):
            continue  # built-in (converted on first use), or reported by the path check
        problems += [f"{key}: {p}" for p in model_path_problems(folder, need_tokenizer)]
    return problems


def _data_problems(config) -> list[str]:
    if config.custom_reward_function.path or config.reward_model.enable:
        return []  # the user's function or a reward model decides what a data source or a ground truth may be
    from npu_rl.config.derived import as_list
    from npu_rl.data.dataset import ground_truth_of
    from npu_rl.data.io import read_rows
    from npu_rl.reward.scorers import PREFIX_SCORERS, SCORERS, scorer_for

    key = str(config.data.reward_fn_key)
    problems = []
    for files_key in ("train_files", "val_files"):
        for path in as_list(getattr(config.data, files_key)):
            path = str(path)
            if path.startswith("builtin://") or not os.path.isfile(os.path.expanduser(path)):
                continue
            try:
                rows = read_rows(path)
            except (OSError, ValueError):
                continue  # unreadable: the data loader says why, naming the file
            unknown: dict[str, list[int]] = {}
            bad_truth: list[tuple[int, Any]] = []
            for i, row in enumerate(rows):
                source = row.get(key, "unknown" if key == "data_source" else None)
                if scorer_for(source) is None:
                    unknown.setdefault(str(source), []).append(i)
                truth = ground_truth_of(row)
                if truth is not None and (isinstance(truth, bool) or not isinstance(truth, (str, int, float))):
                    bad_truth.append((i, truth))
            for source, rows_of in unknown.items():
                known = ", ".join(SCORERS.names() + [p + "*" for p in PREFIX_SCORERS])
                problems.append(f"data.{files_key}: {path}: row {rows_of[0]}"
                                + (f" (and {len(rows_of) - 1} more rows)" if len(rows_of) > 1 else "")
                                + f": data.reward_fn_key {key!r} is {source!r}, which has no rule scorer (known: "
                                f"{known}); fix the column, or set custom_reward_function.path / .name")
            for i, truth in bad_truth[:MAX_LISTED]:
                problems.append(f"data.{files_key}: {path}: row {i}: reward_model.ground_truth is a "
                                f"{type(truth).__name__} ({str(truth)[:60]!r}); the rule scorers compare it as text "
                                "and would score 0 on every sample. Give a string or a number, or a "
                                "custom_reward_function that reads this type")
            if len(bad_truth) > MAX_LISTED:
                problems.append(f"data.{files_key}: {path}: {len(bad_truth) - MAX_LISTED} more rows with such a "
                                "ground truth")
    return problems
