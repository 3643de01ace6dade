"""Checks on the files a run reads and writes (``check_paths``): data files and, when the default rule scorers score
them, their rows; model folders; the output folder. Each problem names the key, the file and the row.

- data files exist (or are a valid ``builtin://`` / ``hf://`` data set, a glob, a ``save_to_disk`` folder or a
  ``DatasetDict`` root: ``npu_rl.data.sources``); a parquet file's footer reads (a truncated file, or one that is
  not parquet, is named; a damaged column is named by the data loader, with its column and rows);
- a run that cannot do what it asks is refused: a vision-language actor other than Qwen-VL or with options not built
  for it (docs/vl.md), image rows for a text actor, bad image rows (named), video / audio rows, a reward function
  calling verl's GenRM router;
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
from npu_rl.data.dataset import ground_truth_of
from npu_rl.data.io import PARQUET_SUFFIXES, parquet_problem, read_rows
from npu_rl.data.sources import data_files_problems, has_image_rows, multimodal_problems, resolve_data_path
from npu_rl.models.check import model_path_problems
from npu_rl.models.kinds import actor_model_problem, image_patch_size_problem, is_vision_language, \
    reward_function_problem, vision_language_problems
from npu_rl.models.loader import check_model_path, is_builtin, local_model_folder
from npu_rl.models.lora import check_against_model
from npu_rl.reward.scorers import PREFIX_SCORERS, SCORERS, scorer_for
from npu_rl.trainer.checks.names import Problems

MAX_LISTED = 3


def file_problems(config, use_critic: bool) -> list[str]:
    p = Problems()
    for key in ("train_files", "val_files"):
        p += data_files_problems(key, getattr(config.data, key))
    p.attempt(lambda: _check_model_path(config.actor_rollout_ref.model.path), "actor_rollout_ref.model.path: ")
    if config.actor_rollout_ref.model.lora_rank > 0:
        p.attempt(lambda: check_against_model(config.actor_rollout_ref.model))
    if use_critic:
        p.attempt(lambda: _check_model_path(config.critic.model.path), "critic.model.path: ")
    if config.reward_model.enable:
        p.attempt(lambda: _check_model_path(config.reward_model.model.path), "reward_model.model.path: ")
    p += _model_problems(config, use_critic)
    p += _unreadable_data(config)
    p += _data_problems(config)
    p += _capability_problems(config, use_critic)
    return p


def _check_model_path(path: str) -> None:
    check_model_path(path)  # a local folder, the embedded model or a Hub id (npu_rl.models.hub)


def _resolved_data(config, files_key: str) -> list[str]:
    """The local files of ``data.<files_key>`` (globs, save_to_disk folders, DatasetDict roots, hf:// already
    fetched by the path check); built-in sets and entries the path check reports are left out."""
    resolved = []
    for item in as_list(getattr(config.data, files_key)):
        if str(item).startswith("builtin://"):
            continue
        try:
            resolved += resolve_data_path(str(item), "train" if files_key == "train_files" else "validation")
        except (OSError, ValueError, TypeError, ImportError):  # reported by the path check
            continue
    return resolved


def _capability_problems(config, use_critic: bool) -> list[str]:
    """Runs accepted by the schema that cannot do what they ask: a vision-language actor or image rows it cannot
    take, a reward function calling verl's GenRM router (npu_rl.models.kinds, npu_rl.data.sources.multimodal_problems)."""
    problems = []
    actor_path = str(config.actor_rollout_ref.model.path)
    folder = None if is_builtin(actor_path) else local_model_folder(actor_path)
    actor_is_vl = bool(folder) and is_vision_language(folder)
    if folder:
        problems.append(actor_model_problem("actor_rollout_ref.model.path", folder))
    if actor_is_vl:
        problems.append(image_patch_size_problem(folder, int(config.data.image_patch_size)))
        arr = config.actor_rollout_ref
        problems += vision_language_problems(
            "actor_rollout_ref.model.path",
            sp_sizes={f"actor_rollout_ref.{role}.ulysses_sequence_parallel_size":
                      int(getattr(arr, role).ulysses_sequence_parallel_size) for role in ("actor", "ref")},
            rollout_name=str(arr.rollout.name),
            agent_loops=arr.rollout.mode == "async" or bool(arr.rollout.multi_turn.enable),
            lora_adapter_in_vllm=int(arr.model.lora_rank) > 0 and not bool(arr.model.lora.merge))
    if bool(config.actor_rollout_ref.actor.freeze_vision_tower) and folder and not actor_is_vl:
        problems.append(f"actor_rollout_ref.actor.freeze_vision_tower=True, but the actor ({actor_path}) is a text "
                        "model with no vision tower: set it to False")
    if use_critic:
        critic_folder = None if is_builtin(str(config.critic.model.path)) else local_model_folder(
            str(config.critic.model.path))
        if critic_folder and is_vision_language(critic_folder):
            problems.append(f"critic.model.path: {critic_folder} is a vision-language model; a value model over "
                            "images is not built (GRPO-style estimators need no critic)")
    fn = config.custom_reward_function
    if fn.path:
        problems.append(reward_function_problem(str(fn.path), str(fn.name or "compute_score")))
    image_key, prompt_key = str(config.data.image_key), str(config.data.prompt_key)
    for files_key in ("train_files", "val_files"):
        paths = _resolved_data(config, files_key)
        problems += multimodal_problems(files_key, paths, image_key, prompt_key)
        if not actor_is_vl and has_image_rows(paths, image_key):
            problems.append(f"data.{files_key}: rows carry images ({image_key!r}) but the actor "
                            f"({actor_path}) reads text only and would drop them; use a text data set")
    return [p for p in problems if p]


def _model_problems(config, use_critic: bool) -> list[str]:
    keys = [("actor_rollout_ref.model.path", config.actor_rollout_ref.model.path, True)]
    if use_critic:
        keys.append(("critic.model.path", config.critic.model.path, False))
    problems = []
    for key, path, need_tokenizer in keys:
        folder = None if is_builtin(str(path)) else local_model_folder(str(path))
        if folder is None or not os.path.isfile(os.path.join(folder, "config.json")):
            continue  # built-in (converted on first use), a Hub id not downloaded yet, or reported by the path check
        problems += [f"{key}: {p}" for p in model_path_problems(folder, need_tokenizer)]
    return problems


def _unreadable_data(config) -> list[str]:
    """Parquet files whose footer does not read (truncated, not parquet): named now, from the footer alone."""
    problems = []
    for files_key in ("train_files", "val_files"):
        for path in _resolved_data(config, files_key):
            if path.lower().endswith(PARQUET_SUFFIXES) and os.path.isfile(path):
                problem = parquet_problem(path)
                if problem:
                    problems.append(f"data.{files_key}: {problem}")
    return problems


def _data_problems(config) -> list[str]:
    if config.custom_reward_function.path or config.reward_model.enable:
        return []  # the user's function or a reward model decides what a data source or a ground truth may be

    key = str(config.data.reward_fn_key)
    problems = []
    for files_key in ("train_files", "val_files"):
        for path in _resolved_data(config, files_key):
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
