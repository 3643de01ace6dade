"""On-policy distillation (``distillation.*``): the loss's settings for the plan, and the checks that need more than
one key or the teacher's folder. Each problem names the key and what to change."""

from __future__ import annotations

import json
import os

from npu_rl.config.schema import PPOConfig
from npu_rl.core import resolved_clip_ratios
from npu_rl.core.distillation import TOPK_LOSS_MODES, DistillationSpec, distillation_problems
from npu_rl.models.check import model_path_problems
from npu_rl.models.kinds import is_vision_language
from npu_rl.models.loader import check_model_path, is_builtin, local_model_folder
from npu_rl.trainer.checks.names import Problems

LOSS_KEY = "distillation.distillation_loss"


def distillation_spec(config: PPOConfig) -> DistillationSpec | None:
    """The core's settings of the distillation loss, or None when distillation is off."""
    d = config.distillation
    if not d.enabled:
        return None
    loss = d.distillation_loss
    low, high = resolved_clip_ratios(loss.clip_ratio, loss.clip_ratio_low, loss.clip_ratio_high)
    return DistillationSpec(loss_mode=loss.loss_mode, use_task_rewards=bool(loss.use_task_rewards),
                            distillation_loss_coef=float(loss.distillation_loss_coef),
                            loss_max_clamp=None if loss.loss_max_clamp is None else float(loss.loss_max_clamp),
                            use_policy_gradient=bool(loss.use_policy_gradient), clip_ratio_low=float(low),
                            clip_ratio_high=float(high),
                            topk=int(loss.topk or 0) if loss.loss_mode in TOPK_LOSS_MODES else 0,
                            log_prob_min_clamp=None if loss.log_prob_min_clamp is None
                            else float(loss.log_prob_min_clamp))


def distillation_config_problems(config: PPOConfig) -> list[str]:
    """The loss's settings, and the modes the teacher's forward is wired into."""
    d = config.distillation
    if not d.enabled:
        return []
    loss = d.distillation_loss
    problems = distillation_problems(str(loss.loss_mode), bool(loss.use_policy_gradient), str(loss.policy_loss_mode),
                                     LOSS_KEY, topk=loss.topk)
    if loss.loss_mode in TOPK_LOSS_MODES and config.actor_rollout_ref.model.use_fused_kernels:
        problems.append(f"{LOSS_KEY}.loss_mode={loss.loss_mode} with actor_rollout_ref.model.use_fused_kernels=True: "
                        "the top-k log-probs are computed on the plain log-prob path only; set "
                        "actor_rollout_ref.model.use_fused_kernels=False")
    if config.async_training.mode != "sync":
        problems.append(f"distillation.enabled=True with async_training.mode={config.async_training.mode}: the "
                        "teacher is wired into the synchronous trainer only; use async_training.mode=sync")
    return problems


def _vocab(folder: str) -> tuple[int | None, dict | None]:
    """(config.json's vocab_size, tokenizer.json's vocabulary) of a model folder; None where absent."""
    size = vocab = None
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
            vocab = (json.load(f).get("model") or {}).get("vocab")
    except (OSError, ValueError):
        pass
    return size, vocab if isinstance(vocab, dict) else None


def teacher_file_problems(config: PPOConfig) -> list[str]:
    """Each teacher's folder resolves, holds a text model with weights, and reads the student's token ids as the
    same tokens: its vocabulary is not smaller than the student's, and where both folders hold a tokenizer.json
    their vocabularies are the same (the teacher scores the student's token ids as they are)."""
    if not config.distillation.enabled:
        return []
    return [problem for name, teacher in config.distillation.teacher_entries().items() if teacher.model_path
            for problem in _teacher_folder_problems(config, f"distillation.teacher_models.{name}.model_path",
                                                    str(teacher.model_path))]


def _teacher_folder_problems(config: PPOConfig, key: str, path: str) -> list[str]:
    found = Problems()
    found.attempt(lambda: check_model_path(path), f"{key}: ")
    if found:
        return list(found)
    folder = None if is_builtin(path) else local_model_folder(path)
    if folder is None or not os.path.isfile(os.path.join(folder, "config.json")):
        return []  # built-in (converted on first use) or a Hub id fetched at load
    problems = [f"{key}: {p}" for p in model_path_problems(folder, False)]
    if is_vision_language(folder):  # a Qwen-VL student may train, but no teacher gets the images
        problems.append(f"{key}: {folder} is a vision-language model (the teacher's forward takes no "
                        "images); npu-rl distils text-only models: use a text teacher")
    student_path = str(config.actor_rollout_ref.model.path)
    student = None if is_builtin(student_path) else local_model_folder(student_path)
    if student is None:
        return problems
    (t_size, t_vocab), (s_size, s_vocab) = _vocab(folder), _vocab(student)
    if t_size is not None and s_size is not None and int(t_size) < int(s_size):
        problems.append(f"{key}: the teacher's vocabulary ({t_size} ids, {folder}/config.json) is smaller "
                        f"than the student's ({s_size}, actor_rollout_ref.model.path): the student's token ids could "
                        "fall outside it. The teacher must share the student's tokenizer (a model of the same family)")
    elif t_vocab is not None and s_vocab is not None and t_vocab != s_vocab:
        differ = sorted(set(t_vocab.items()) ^ set(s_vocab.items()), key=str)[:3]
        problems.append(f"{key}: the teacher's tokenizer.json maps tokens to other ids than the student's "
                        f"(e.g. {differ}): it would score other tokens than the student sampled. Use a teacher of "
                        "the student's family (the same tokenizer)")
    return problems
