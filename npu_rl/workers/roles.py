"""The roles of a run, each given its own config slice and the run settings: the one place that slices the root config
for the workers."""

from __future__ import annotations

import dataclasses

from npu_rl.config.derived import RunSettings
from npu_rl.config.schema import PPOConfig
from npu_rl.controller.worker_group import WorkerSpec
from npu_rl.workers.actor_rollout import ActorRolloutWorker
from npu_rl.workers.critic import CriticWorker
from npu_rl.workers.reference import ReferenceWorker
from npu_rl.workers.judge import JudgeWorker
from npu_rl.workers.prime_rm import ImplicitPRMWorker
from npu_rl.workers.reward_model import RewardModelWorker
from npu_rl.workers.teacher import TeacherWorker, teacher_slices


def worker_specs(config: PPOConfig, run_settings: RunSettings) -> dict[str, WorkerSpec]:
    """``{role name: WorkerSpec}`` for every role the plan needs; all colocated on the same devices."""
    arr = config.actor_rollout_ref
    rollout = arr.rollout
    if config.async_training.mode != "sync":  # the rollout pool generates; the trainer keeps only the free hf twin
        rollout = dataclasses.replace(rollout, name="hf", free_cache_engine=False)
    roles = {"actor_rollout": WorkerSpec(ActorRolloutWorker, (arr.model, arr.actor, rollout, run_settings))}
    if run_settings.use_ref and not run_settings.ref_in_actor:  # with LoRA the actor serves the reference (adapter off)
        roles["ref"] = WorkerSpec(ReferenceWorker, (arr.model, arr.ref, run_settings))
    if run_settings.use_critic:
        roles["critic"] = WorkerSpec(CriticWorker, (config.critic, run_settings))
    if run_settings.distillation is not None:  # a frozen teacher on the same devices, like the reference
        teacher_model, teacher_ref = teacher_slices(arr.model, arr.ref, config.distillation.teacher_models.teacher_model)
        roles["teacher"] = WorkerSpec(TeacherWorker, (teacher_model, teacher_ref, run_settings))
    if run_settings.prime is not None and run_settings.prime.use_prm:  # PRIME's implicit PRM (trained), and its ref
        roles["prm"] = WorkerSpec(ImplicitPRMWorker, (arr, config.reward_model, run_settings))
    if run_settings.use_reward_model and run_settings.reward_judge:  # a generative reward model, served on rank 0
        roles["judge"] = WorkerSpec(JudgeWorker, (config.reward_model, run_settings))
    elif run_settings.use_reward_model:
        roles["reward_model"] = WorkerSpec(RewardModelWorker, (config.reward_model, run_settings))
    return roles
