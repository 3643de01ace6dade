"""Checks on the files a run reads and writes (``check_paths``): data files and, when the default rule scorers score
them, their rows; model folders; the output folder. Each problem names the key, the file and the row.

- data files exist (or are a valid ``builtin://`` / ``hf://`` data set, or a ``save_to_disk`` folder);
- model folders resolve; their tokenizer files are present, their weights present and not truncated
  (``npu_rl.models.check``); a LoRA adapter fits the model;
- (the output folder, ``trainer.default_local_dir``, is the preflight's run-folder check);
- data rows scored by the default rule scorers (no ``custom_reward_function.path``, no reward model): every row's
  ``data_source`` has a scorer, and its ground truth is text or a number (a list / dict / bool compared as text
  scores 0 for ever).
"""

from __future__ import annotations

import os
from typing import Any

from npu_rl.config.derived import as_list
from npu_rl.trainer.checks.names import Problems

MAX_LISTED = 3


def file_problems(config, use_critic: bool) -> list[str]:
    from npu_rl.models.loader import resolve_model_path

    p = Problems()
    for key in ("train_files", "val_files"):
        files = as_list(getattr(config.data, key))
        if not files:
            p.append(f"data.{key} is empty")
        for path in files:
            p.attempt(lambda: _require_data_file(key, str(path)))
    p.attempt(lambda: _check_model_path(config.actor_rollout_ref.model.path), "actor_rollout_ref.model.path: ")
    if config.actor_rollout_ref.model.lora_rank > 0:
        from npu_rl.models.lora import check_against_model

        p.attempt(lambda: check_against_model(config.actor_rollout_ref.model))
    if use_critic:
        p.attempt(lambda: _check_model_path(config.critic.model.path), "critic.model.path: ")
    if config.reward_model.enable:
        p.attempt(lambda: resolve_model_path(config.reward_model.model.path), "reward_model.model.path: ")
    p += _model_problems(config, use_critic)
    p += _data_problems(config)
    return p


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


def _model_problems(config, use_critic: bool) -> list[str]:
    from npu_rl.models.check import model_path_problems
    from npu_rl.models.loader import is_builtin

    keys = [("actor_rollout_ref.model.path", config.actor_rollout_ref.model.path, True)]
    if use_critic:
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
