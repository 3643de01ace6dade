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
    """The asynchronous trainers' settings (verl's names and defaults); read only when ``mode`` is not ``sync``."""

    mode: str = "sync"
    """npu-rl: sync | one_step_off | fully_async; set by the entry point (verl: the module)"""
    staleness_threshold: float = 0.1
    """fully async: freshness control (0: synchronous streaming; docs/async.md): at most (1 + this) x
    trigger_parameter_sync_step x require_batches x ppo_mini_batch_size prompts are generated per policy version; a
    sample more than ceil(this) weight pushes old is dropped, counted"""
    trigger_parameter_sync_step: int = 4
    """fully async: updates between two weight pushes to the rollout pool"""
    require_batches: int = 1
    """fully async: ppo_mini_batch_size-prompt mini-batches the trainer takes per update"""
    partial_rollout: bool = True
    """fully async: at a weight push, in-flight generations stop (hf: at the next decode step; vllm: at the next
    segment boundary) and continue from their tokens on the new weights, instead of finishing on the old ones first
    (docs/async.md)"""
    use_trainer_do_validate: bool = False
    """validate on the trainer pool; not built (the rollout pool validates)"""
    use_dynamic_resource_scheduling: bool = False
    """lend trainer devices to rollout replicas; not built"""
    dynamic_schedule_policy: str = "default"
    """read only with use_dynamic_resource_scheduling"""
    dynamic_schedule_deactivate_ratio: float = 0.3
    """read only with use_dynamic_resource_scheduling"""
    dynamic_schedule_enable_rebalance: bool = True
    """read only with use_dynamic_resource_scheduling"""
    concurrent_samples_per_replica: int = 16
    """verl's server replicas; here a rollout rank generates a batch a call"""


@dataclass
class RolloutPoolConfig:
    """Top-level ``rollout``: the separate rollout pool of the asynchronous trainers (verl: resource isolation)."""

    nnodes: int = 1
    """nodes of the rollout pool"""
    n_gpus_per_node: int = 8
    """devices per node of the rollout pool (CPU: processes); one rollout rank each"""
    total_rollout_steps: Optional[int] = None
    """fully async: prompts to generate in all (null: the epochs' prompts)"""
    n: int = 4
    """verl's fully-async YAML has it; the samples per prompt are actor_rollout_ref.rollout.n"""
    test_freq: int = -1
    """verl's fully-async README; here trainer.test_freq decides when to validate"""


def async_notes(config: Any, defaults: Any, current: Any) -> list[str]:
    """In sync mode, a note for each ``async_training.*`` / ``rollout.*`` key the user changed (they take effect
    only with the asynchronous entry points). ``defaults`` / ``current``: the baseline and the config as OmegaConf."""
    if config.async_training.mode != "sync":
        return []
    from omegaconf import OmegaConf

    notes = []
    for tree in ("async_training", "rollout"):
        for key, value in OmegaConf.to_container(OmegaConf.select(current, tree)).items():
            if key != "mode" and value != OmegaConf.select(defaults, f"{tree}.{key}"):
                notes.append(f"{tree}.{key}={value!r} has no effect with npu_rl.trainer.main_ppo: it is read by "
                             "the asynchronous trainers (python -m npu_rl.experimental.one_step_off_policy.main_ppo "
                             "or ...fully_async_policy.fully_async_main; docs/async.md)")
    return notes


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
    rollout = arr.rollout
    # rollout.mode=async alone (verl's fully-async scripts) with single-turn rows: the pool runs them as a plain
    # generation, which a push interrupts; rows naming another loop are refused with the data (agent_row_problems)
    multi_turn_loops = (rollout.multi_turn.enable or rollout.agent.agent_loop_config_path
                        or rollout.agent.default_agent_loop != "single_turn_agent")
    if at.partial_rollout and (rollout.mode == "async" or rollout.multi_turn.enable) and multi_turn_loops:
        problems.append("async_training.partial_rollout=True with multi-turn agent loops (actor_rollout_ref.rollout."
                        f"multi_turn.enable={rollout.multi_turn.enable}, agent.default_agent_loop="
                        f"{rollout.agent.default_agent_loop!r}, agent.agent_loop_config_path="
                        f"{rollout.agent.agent_loop_config_path!r}) is not built: interrupting a conversation's turn "
                        "at a weight push is not. Set async_training.partial_rollout=False (in-flight generations "
                        "finish on the old weights, then the push); single-turn rows (rollout.mode=async with the "
                        "single_turn_agent loop, or rollout.mode=sync) are interrupted")
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
    return problems


def streaming_batch_size(config: Any) -> int:
    """Prompts per update of the fully asynchronous trainer: ``require_batches x actor.ppo_mini_batch_size``."""
    return int(config.async_training.require_batches) * int(config.actor_rollout_ref.actor.ppo_mini_batch_size)
