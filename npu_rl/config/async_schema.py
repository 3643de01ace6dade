"""The asynchronous trainers' keys, with verl's names and defaults: top-level ``async_training.*`` and ``rollout.*``.

verl enters its two asynchronous trainers by module (``verl.experimental.one_step_off_policy.main_ppo``,
``verl.experimental.fully_async_policy.fully_async_main``, configs ``one_step_off_ppo_trainer`` /
``fully_async_ppo_trainer``); the same scripts run here with the module changed to ``npu_rl.experimental...``. The
entry point sets ``async_training.mode`` (an npu-rl key: verl has one trainer class per module instead). The
mechanism is ``npu_rl/trainer/async_rollouts.py``; docs/async.md has the modes, the metrics and a diagram.

:func:`async_problems` lists what this build refuses, each with the reason and what to do instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

ASYNC_MODES = ("sync", "one_step_off", "fully_async")


@dataclass
class AsyncTrainingConfig:
    mode: str = "sync"
    """npu-rl: which trainer runs: ``sync`` (``npu_rl.trainer.main_ppo``), ``one_step_off`` or ``fully_async``. Set
    by the entry point; the other keys of this tree take effect only in the two asynchronous modes."""

    staleness_threshold: float = 0.1
    """Fully async: the rollout pool generates at most ``(1 + staleness_threshold) x trigger_parameter_sync_step x
    require_batches x ppo_mini_batch_size`` prompts' samples per policy version (0: synchronous streaming). A sample
    reaching the trainer more than ``ceil(staleness_threshold)`` versions old is dropped and counted."""

    trigger_parameter_sync_step: int = 4
    """Fully async: updates between two weight pushes to the rollout pool."""

    require_batches: int = 1
    """Fully async: mini-batches (``actor.ppo_mini_batch_size`` prompts each) the trainer takes per update."""

    partial_rollout: bool = True
    """Fully async: interrupt in-flight generations at a weight push and resume them on the new weights. Not built:
    ``False`` is required (in-flight generations finish on the old weights, then the push)."""

    use_trainer_do_validate: bool = False
    """Validation on the trainer pool instead of the rollout pool. Not built: validation runs on the rollout pool
    right after a weight push, with the trainer's current weights."""

    use_dynamic_resource_scheduling: bool = False
    """verl: lend the trainer's devices to rollout replicas. Not built (must stay False)."""

    dynamic_schedule_policy: str = "default"
    """verl: the dynamic scheduling policy; read only with ``use_dynamic_resource_scheduling``."""

    dynamic_schedule_deactivate_ratio: float = 0.3
    """verl: dynamic scheduling; read only with ``use_dynamic_resource_scheduling``."""

    dynamic_schedule_enable_rebalance: bool = True
    """verl: dynamic scheduling; read only with ``use_dynamic_resource_scheduling``."""

    concurrent_samples_per_replica: int = 16
    """verl: concurrent requests per server replica. Here each rollout rank generates one prompt batch per call."""


@dataclass
class RolloutPoolConfig:
    """Top-level ``rollout``: the devices of the separate rollout pool (verl: "only for resource isolation")."""

    nnodes: int = 1
    """Nodes of the rollout pool."""

    n_gpus_per_node: int = 8
    """Devices per node of the rollout pool (on CPU: processes). One rollout rank per device."""

    total_rollout_steps: Optional[int] = None
    """Fully async: the number of prompts to generate in all (verl counts prompts); None: the epochs' prompts."""

    n: int = 4
    """verl's fully-async YAML has it; the samples per prompt are ``actor_rollout_ref.rollout.n``."""

    test_freq: int = -1
    """verl's fully-async README: validate every this many weight pushes. Here ``trainer.test_freq`` decides."""


def staleness_versions(threshold: float) -> int:
    """The most policy versions a sample may lag behind the trainer: 0 at threshold 0, else ``ceil(threshold)``
    (a production budget of ``(1 + s) x K`` samples per version leaves at most ``ceil(s)`` versions in the queue)."""
    return int(math.ceil(threshold)) if threshold > 0 else 0


def async_problems(config: Any) -> list[str]:
    """What the asynchronous modes refuse, with the reason; [] in sync mode or when everything is built."""
    at, pool = config.async_training, config.rollout
    if at.mode not in ASYNC_MODES:
        return [f"async_training.mode={at.mode!r} is not one of {', '.join(ASYNC_MODES)}"]
    if at.mode == "sync":
        return []
    problems: list[str] = []
    entry = ("npu_rl.experimental.one_step_off_policy.main_ppo" if at.mode == "one_step_off"
             else "npu_rl.experimental.fully_async_policy.fully_async_main")
    if config.actor_rollout_ref.hybrid_engine:
        problems.append(f"{entry} runs the rollout on its own pool: set actor_rollout_ref.hybrid_engine=False (a "
                        "colocated run is python -m npu_rl.trainer.main_ppo)")
    if pool.nnodes < 1 or pool.n_gpus_per_node < 1:
        problems.append(f"rollout.nnodes={pool.nnodes} x rollout.n_gpus_per_node={pool.n_gpus_per_node}: the rollout "
                        "pool needs at least one device")
    arr = config.actor_rollout_ref
    if arr.rollout.mode == "async" or arr.rollout.multi_turn.enable:
        problems.append("agent loops (rollout.mode=async / multi_turn.enable) on the separate rollout pool are not "
                        "built yet: the pool generates single-turn batches")
    if arr.model.lora_rank or arr.model.lora_adapter_path:
        problems.append(f"{entry} with LoRA is not built yet (the weight push sends full weights): train the full "
                        "model, or use python -m npu_rl.trainer.main_ppo")
    if config.algorithm.adv_estimator == "remax":
        problems.append("adv_estimator=remax needs a greedy baseline generated with the current weights; the "
                        "asynchronous trainers do not run it: use grpo / rloo / reinforce_plus_plus")
    if at.mode == "fully_async":
        problems += _fully_async_problems(config)
    elif config.data.train_batch_size < 1:
        problems.append("one-step off-policy needs data.train_batch_size >= 1 prompts per step (0 streams, which is "
                        "the fully asynchronous trainer's setting)")
    return problems


def _fully_async_problems(config: Any) -> list[str]:
    at, arr = config.async_training, config.actor_rollout_ref
    problems: list[str] = []
    if at.partial_rollout:
        problems.append("async_training.partial_rollout=True is not built: the hf and offline vllm engines cannot "
                        "pause a request at a weight push and resume it. Set async_training.partial_rollout=False "
                        "(in-flight generations finish on the old weights, then the push)")
    if at.use_dynamic_resource_scheduling:
        problems.append("async_training.use_dynamic_resource_scheduling=True (trainer devices lent to rollout "
                        "replicas) is not built: leave it False")
    if at.use_trainer_do_validate:
        problems.append("async_training.use_trainer_do_validate=True is not built: validation runs on the rollout "
                        "pool right after a weight push; leave it False")
    if at.staleness_threshold < 0:
        problems.append(f"async_training.staleness_threshold={at.staleness_threshold} must be >= 0")
    if at.trigger_parameter_sync_step < 1 or at.require_batches < 1:
        problems.append("async_training.trigger_parameter_sync_step and require_batches must be >= 1")
    if config.algorithm.filter_groups.enable:
        problems.append("algorithm.filter_groups (dynamic sampling) with the streaming trainer is not built: the "
                        "trainer takes require_batches mini-batches as they come")
    if config.data.train_batch_size not in (0, streaming_batch_size(config)):
        problems.append(f"data.train_batch_size={config.data.train_batch_size}: the fully asynchronous trainer "
                        f"streams require_batches x actor.ppo_mini_batch_size = {streaming_batch_size(config)} prompts "
                        "per update; set data.train_batch_size=0 (verl's setting) or to that number")
    del arr
    return problems


def streaming_batch_size(config: Any) -> int:
    """Prompts per update of the fully asynchronous trainer: ``require_batches x actor.ppo_mini_batch_size``."""
    return int(config.async_training.require_batches) * int(config.actor_rollout_ref.actor.ppo_mini_batch_size)
