"""verl's derived settings, applied to a resolved config once, right after loading (see ``loader.load_config``).

verl's workers rewrite some keys at start-up; a verl script relies on that, so npu-rl does the same here, where the
numbers are known, and says what it did (one note per change):

- The deprecated *global* micro-batch sizes are divided by the number of data-parallel ranks, as verl's FSDP workers
  do (``ppo_micro_batch_size //= world_size // ulysses_sp``), and become the ``*_per_gpu`` key:
  ``actor.ppo_micro_batch_size``, ``critic.ppo_micro_batch_size``, ``critic.forward_micro_batch_size``,
  ``ref.log_prob_micro_batch_size``, ``rollout.log_prob_micro_batch_size`` (actor's sequence-parallel size) and
  ``reward_model.micro_batch_size`` (divided by the world size). Where the per-GPU key is also set, nothing is
  changed (validation then asks for one of the two).
- A per-rank mini-batch that is not a multiple of the micro-batch size runs, as in verl: the last micro-batch of
  each mini-batch is smaller. The loss is aggregated with global denominators, so the gradient is the same.
"""

from __future__ import annotations

from npu_rl.config.schema import PPOConfig

# (config path, global key, per-GPU key, where the sequence-parallel size is read; None: divide by the world size)
GLOBAL_MICRO_BATCH_KEYS: tuple[tuple[str, str, str, str | None], ...] = (
    ("actor_rollout_ref.actor", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu", "actor_rollout_ref.actor"),
    ("actor_rollout_ref.ref", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu",
     "actor_rollout_ref.ref"),
    ("actor_rollout_ref.rollout", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu",
     "actor_rollout_ref.actor"),
    ("critic", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu", "critic"),
    ("critic", "forward_micro_batch_size", "forward_micro_batch_size_per_gpu", "critic"),
    ("reward_model", "micro_batch_size", "micro_batch_size_per_gpu", None),
)


def _node(config: PPOConfig, path: str):
    node = config
    for part in path.split("."):
        node = getattr(node, part)
    return node


def _as_int(value) -> int | None:
    """An int from a resolved config value (None stays None; an unresolved string is left to validation)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def apply_verl_semantics(config: PPOConfig) -> list[str]:
    """Rewrite ``config`` in place as verl's workers would; returns the notes saying what changed."""
    notes: list[str] = []
    world = config.trainer.nnodes * config.trainer.n_gpus_per_node
    for path, global_key, per_gpu_key, sp_path in GLOBAL_MICRO_BATCH_KEYS:
        node = _node(config, path)
        total = _as_int(getattr(node, global_key))
        if total is None or getattr(node, per_gpu_key) is not None:
            continue
        sp = _as_int(_node(config, sp_path).ulysses_sequence_parallel_size) if sp_path else 1
        ranks = max(world // max(sp or 1, 1), 1)
        per_gpu = max(total // ranks, 1)
        setattr(node, per_gpu_key, per_gpu)
        setattr(node, global_key, None)
        notes.append(f"{path}.{global_key}={total} is global (verl's deprecated key): {per_gpu} per rank over "
                     f"{ranks} data-parallel rank(s), i.e. {path}.{per_gpu_key}={per_gpu}")
    notes.extend(_uneven_micro_batches(config, world))
    return notes


def _uneven_micro_batches(config: PPOConfig, world: int) -> list[str]:
    from npu_rl.config.validate import critic_enabled

    arr = config.actor_rollout_ref
    roles = [("actor_rollout_ref.actor", arr.actor, arr.actor.ulysses_sequence_parallel_size)]
    if critic_enabled(config):
        roles.append(("critic", config.critic, config.critic.ulysses_sequence_parallel_size))
    notes = []
    for key, role, sp in roles:
        micro, mini = _as_int(role.ppo_micro_batch_size_per_gpu), _as_int(role.ppo_mini_batch_size)
        sp = _as_int(sp) or 1
        if role.use_dynamic_bsz is True or micro is None or mini is None or micro <= 0 or world % sp:
            continue
        rows = mini * arr.rollout.n
        dp = world // sp
        if rows % dp or (rows // dp) % micro == 0:
            continue
        per_rank = rows // dp
        notes.append(f"{key}: the {per_rank} rows per rank of a mini-batch are not a multiple of "
                     f"ppo_micro_batch_size_per_gpu={micro}; as in verl, the last micro-batch holds {per_rank % micro} "
                     "(the loss uses the mini-batch's global token and sequence counts, so the gradient is unchanged)")
    return notes
