"""Roles on devices of their own (verl's ``teacher_pool`` / ``reward_pool``: ``distillation.{nnodes,n_gpus_per_node}``,
``reward_model.{enable_resource_pool,nnodes,n_gpus_per_node}``): whether they can be placed. Each problem names the
keys and what to change."""

from __future__ import annotations

import os

from npu_rl.config.derived import world_size
from npu_rl.config.schema import PPOConfig
from npu_rl.controller.worker_group import use_ray
from npu_rl.workers.roles import OwnPool, own_pools


ROLE_OF_POOL = {"distillation": "teacher", "reward_model": "reward model"}  # what runs on each kind of pool


def _pool_keys(pool: OwnPool) -> str:
    return f"{pool.key}.nnodes={pool.nnodes} x {pool.key}.n_gpus_per_node={pool.n_gpus_per_node}"


def pool_problems(config: PPOConfig) -> list[str]:
    """What the config alone says cannot be placed: the teacher's sequence-parallel groups must tile its pool; a
    vLLM judge runs on one device; on CPU, Ray needs a CPU per rank of every pool."""
    pools = {name: pool for name, pool in own_pools(config).items() if pool.world_size >= 1}
    problems = []
    teacher = next((pool for pool in pools.values() if pool.key == "distillation"), None)
    sp = int(config.actor_rollout_ref.ref.ulysses_sequence_parallel_size)
    if teacher is not None and teacher.world_size % sp:
        problems.append(f"the teacher's own pool ({_pool_keys(teacher)} = {teacher.world_size} devices) is not a "
                        f"multiple of actor_rollout_ref.ref.ulysses_sequence_parallel_size={sp}, which the teacher's "
                        "forward uses: change the pool or the sequence-parallel size")
    rm = config.reward_model
    if rm.enable and rm.enable_resource_pool and rm.reward_manager == "prime":
        problems.append("reward_model.enable_resource_pool=True with reward_model.reward_manager=prime: PRIME's "
                        "implicit PRM trains every step on the trainer's devices; set "
                        "reward_model.enable_resource_pool=False")
    if "reward_model" in pools and rm.rollout.name == "vllm" and pools["reward_model"].world_size > 1:
        problems.append(f"reward_model.rollout.name=vllm on its own pool of {pools['reward_model'].world_size} "
                        f"devices ({_pool_keys(pools['reward_model'])}): a vLLM judge runs on one device; set "
                        "reward_model.n_gpus_per_node=1 and reward_model.nnodes=1, or reward_model.rollout.name=hf")
    num_cpus = config.ray_kwargs.ray_init.num_cpus
    if pools and num_cpus is not None and not config.ray_kwargs.ray_init.address:
        # one CPU per rank (npu_rl/controller/ray_group.py: ResourcePool's bundles); the trainer's group holds its
        # own when it runs on Ray too
        trainer = world_size(config) if use_ray(config.trainer.controller, world_size(config)) else 0
        unique = {p: name for name, p in pools.items()}  # one pool holds all its roles (several teachers)
        needed = trainer + sum(p.world_size for p in unique)
        if needed > int(num_cpus):
            holders = ([f"the trainer's {trainer}"] if trainer else []) + [
                f"the {ROLE_OF_POOL[p.key]}'s {p.world_size} ({_pool_keys(p)})" for p in unique]
            problems.append(f"ray_kwargs.ray_init.num_cpus={num_cpus} is fewer than the {needed} CPUs the run's "
                            f"Ray processes hold (one per rank: {', '.join(holders)}): raise num_cpus or shrink a "
                            "pool")
    return problems


def pool_device_problems(config: PPOConfig, device_name: str, visible: int, visible_env: str) -> list[str]:
    """On an accelerator: a pool asks for no more devices per node than a node has, and on one node the trainer's
    devices and every pool's fit beside each other (the pools never share a device with the trainer)."""
    pools = {p: (ROLE_OF_POOL[p.key], p) for p in own_pools(config).values() if p.world_size >= 1}
    problems = []
    for name, pool in pools.values():
        if pool.n_gpus_per_node > visible:
            problems.append(f"{pool.key}.n_gpus_per_node={pool.n_gpus_per_node} (the {name}'s own pool) but only "
                            f"{visible} {device_name} device(s) are visible on this node ({visible_env}="
                            f"{os.environ.get(visible_env)})")
    single_node = config.trainer.nnodes == 1 and all(p.nnodes == 1 for _, p in pools.values())
    if pools and single_node and not config.ray_kwargs.ray_init.address:
        needed = config.trainer.n_gpus_per_node + sum(p.n_gpus_per_node for _, p in pools.values())
        if needed > visible and not problems:
            problems.append(f"trainer.n_gpus_per_node={config.trainer.n_gpus_per_node} plus "
                            + " plus ".join(f"{p.key}.n_gpus_per_node={p.n_gpus_per_node} ({name})"
                                            for name, p in pools.values())
                            + f" = {needed} devices, but this node has {visible} {device_name} device(s) "
                            f"({visible_env}={os.environ.get(visible_env)}): a role on its own pool takes devices "
                            "the trainer does not use. Shrink a pool, or set it to 0 to share the trainer's devices "
                            "(distillation.nnodes=0, reward_model.enable_resource_pool=False)")
    return problems
