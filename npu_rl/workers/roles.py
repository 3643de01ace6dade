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


@dataclasses.dataclass(frozen=True)
class OwnPool:
    """A role on devices of its own: ``nnodes`` x ``n_gpus_per_node``, named by the keys that set them."""

    nnodes: int
    n_gpus_per_node: int
    key: str  # distillation / reward_model: the config slice holding nnodes and n_gpus_per_node

    @property
    def world_size(self) -> int:
        return self.nnodes * self.n_gpus_per_node


def teacher_roles(config: PPOConfig) -> dict[str, str]:
    """``{role name: routing key}`` of the distillation teachers: ``teacher`` (key ``default``) for one teacher,
    ``teacher[<key>]`` for each of several (npu_rl/trainer/teachers.py routes the rows)."""
    if not config.distillation.enabled:
        return {}
    keys = list(config.distillation.teachers())
    return {"teacher": keys[0]} if keys == ["default"] else {f"teacher[{key}]": key for key in keys}


def own_pools(config: PPOConfig) -> dict[str, OwnPool]:
    """``{role name: OwnPool}`` for the frozen roles that run on devices of their own (verl's ``teacher_pool`` and
    ``reward_pool``): the teacher with ``distillation.nnodes >= 1``, the reward model (a classifier or a judge) with
    ``reward_model.enable_resource_pool``. The other roles share the trainer's devices."""
    pools = {}
    d, rm = config.distillation, config.reward_model
    if d.enabled and d.nnodes >= 1:  # every teacher on the one teacher pool, each sharded over all of it
        pools |= {role: OwnPool(int(d.nnodes), int(d.n_gpus_per_node), "distillation") for role in teacher_roles(config)}
    if rm.enable and rm.enable_resource_pool:
        pool = OwnPool(int(rm.nnodes), int(rm.n_gpus_per_node), "reward_model")
        pools["judge"] = pools["reward_model"] = pool  # whichever of the two the run has
    return pools


def worker_specs(config: PPOConfig, run_settings: RunSettings) -> dict[str, WorkerSpec]:
    """``{role name: WorkerSpec}`` for every role the plan needs; colocated on the trainer's devices except those
    :func:`own_pools` names."""
    arr = config.actor_rollout_ref
    rollout = arr.rollout
    if config.async_training.mode != "sync":  # the rollout pool generates; the trainer keeps only the free hf twin
        rollout = dataclasses.replace(rollout, name="hf", free_cache_engine=False)
    roles = {"actor_rollout": WorkerSpec(ActorRolloutWorker, (arr.model, arr.actor, rollout, run_settings))}
    if run_settings.use_ref and not run_settings.ref_in_actor:  # with LoRA the actor serves the reference (adapter off)
        roles["ref"] = WorkerSpec(ReferenceWorker, (arr.model, arr.ref, run_settings))
    if run_settings.use_critic:
        roles["critic"] = WorkerSpec(CriticWorker, (config.critic, run_settings))
    if run_settings.distillation is not None:  # frozen teachers, beside the actor like the reference or on their pool
        teachers = config.distillation.teachers()
        for role, key in teacher_roles(config).items():
            teacher_model, teacher_ref = teacher_slices(arr.model, arr.ref, teachers[key])
            roles[role] = WorkerSpec(TeacherWorker, (teacher_model, teacher_ref, run_settings))
    if run_settings.prime is not None and run_settings.prime.use_prm:  # PRIME's implicit PRM (trained), and its ref
        roles["prm"] = WorkerSpec(ImplicitPRMWorker, (arr, config.reward_model, run_settings))
    if run_settings.use_reward_model and run_settings.reward_judge:  # a generative reward model, served on rank 0
        roles["judge"] = WorkerSpec(JudgeWorker, (config.reward_model, run_settings))
    elif run_settings.use_reward_model:
        roles["reward_model"] = WorkerSpec(RewardModelWorker, (config.reward_model, run_settings))
    return roles
