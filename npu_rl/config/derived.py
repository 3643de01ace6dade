"""Numbers and switches derived from the config, worked out once, in :func:`derive_run_settings`.

The trainer and the workers read :class:`RunSettings` instead of recomputing ``ppo_mini_batch_size * n // dp``, asking
whether a critic is needed, or rewriting the config: the config is never changed after loading, and what verl's
workers would rewrite at start-up (the deprecated global micro-batch sizes, the rollout log-probs that rollout
correction needs) is a value of the plan. :func:`plan_problems` is the validation of the same arithmetic: every
split of a step's rows must come out even (prompts -> mini-batches -> data-parallel ranks -> micro-batches).

This module reads the config only; what it needs from the rest of the house (what the advantage estimator reads,
the core's rollout-correction and distillation settings) is passed in by the caller
(``npu_rl.trainer.preflight.run_settings_for``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from npu_rl.config.profiler_schema import uses_precision_debugger
from npu_rl.config.rollout_correction import needs_rollout_logprobs, policy_loss_mode
from npu_rl.config.schema import PPOConfig


def as_list(value) -> list:
    """A config value that may be one item or a list (``trainer.logger``, ``data.train_files``) as a list."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def world_size(config: PPOConfig) -> int:
    """Devices of the run: ``trainer.nnodes x trainer.n_gpus_per_node``."""
    return config.trainer.nnodes * config.trainer.n_gpus_per_node


def critic_enabled(config: PPOConfig, needs: frozenset[str]) -> bool:
    """``critic.enable`` when set, else whether the advantage estimator reads values (``needs``: what the estimator
    declares it reads, ``npu_rl.core.estimator_needs``; ``gae`` reads ``values``)."""
    if config.critic.enable is not None:
        return bool(config.critic.enable)
    return "values" in needs


def ref_enabled(config: PPOConfig) -> bool:
    """A reference policy is needed for a KL term: in the loss (``actor.use_kl_loss``) or in the reward."""
    return bool(config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward)


# (config path, verl's deprecated global key, the per-GPU key, where the sequence-parallel size is read (None: divide
# by the world size), the MicroBatchSizes field)
GLOBAL_MICRO_BATCH_KEYS: tuple[tuple[str, str, str, str | None, str], ...] = (
    ("actor_rollout_ref.actor", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu", "actor_rollout_ref.actor",
     "actor_update"),
    ("actor_rollout_ref.rollout", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu",
     "actor_rollout_ref.actor", "actor_logprob"),
    ("actor_rollout_ref.ref", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu",
     "actor_rollout_ref.ref", "ref_logprob"),
    ("critic", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu", "critic", "critic_update"),
    ("critic", "forward_micro_batch_size", "forward_micro_batch_size_per_gpu", "critic", "critic_values"),
    ("reward_model", "micro_batch_size", "micro_batch_size_per_gpu", None, "reward_model"),
)


@dataclass(frozen=True)
class MicroBatchSizes:
    """Rows per micro-batch on one device for each pass (None: the whole batch, or token budgets with
    ``use_dynamic_bsz``): the ``*_per_gpu`` key, or else verl's deprecated *global* key divided by the data-parallel
    ranks, as verl's FSDP workers do (``ppo_micro_batch_size //= world_size // ulysses_sp``; the reward model's by
    the world size). See :data:`GLOBAL_MICRO_BATCH_KEYS`."""

    actor_update: int | None  # actor.ppo_micro_batch_size(_per_gpu)
    actor_logprob: int | None  # rollout.log_prob_micro_batch_size(_per_gpu): the actor's log-prob passes
    ref_logprob: int | None  # ref.log_prob_micro_batch_size(_per_gpu)
    critic_update: int | None  # critic.ppo_micro_batch_size(_per_gpu)
    critic_values: int | None  # critic.forward_micro_batch_size(_per_gpu)
    reward_model: int | None  # reward_model.micro_batch_size(_per_gpu)


@dataclass(frozen=True)
class RoleSettings:
    """How a trained role's step is cut on its ranks."""

    dp_size: int  # data-parallel ranks (devices / ulysses_sequence_parallel_size)
    sp_size: int  # ulysses_sequence_parallel_size
    rows_per_mini_batch: int  # rows of one optimizer step on one rank: ppo_mini_batch_size x rollout.n / dp


@dataclass(frozen=True)
class RunSettings:
    """What the driver and every worker need to know beyond their own config slice."""

    world_size: int
    rollout_n: int
    train_rows: int  # rows of one step: data.train_batch_size x rollout.n
    max_prompt_length: int
    max_response_length: int
    logprob_temperature: float  # the actor's and the reference's log-probs use the rollout's temperature
    seed: int
    use_critic: bool
    use_ref: bool
    use_reward_model: bool
    use_greedy_baseline: bool  # the estimator needs one greedy response's reward per prompt (ReMax)
    policy_model_path: str
    actor: RoleSettings
    critic: RoleSettings | None
    micro_batches: MicroBatchSizes
    # the rollout returns the log-probs of the sampled tokens: rollout.calculate_log_probs, or because
    # algorithm.rollout_correction needs them (then the trainer also logs the rollout_corr/* mismatch metrics)
    rollout_logprobs: bool
    policy_loss_mode: str  # actor.policy_loss.loss_mode, or bypass_mode (algorithm.rollout_correction)
    bypass_correction: Any  # the bypass_mode loss's settings (the core's RolloutCorrectionSpec), else None
    ref_in_actor: bool  # LoRA: the reference is the actor with its adapter off (no reference worker)
    # torch.compile may be used where the device layer allows it (compiled decoding, compiled blocks); False when
    # msprobe's precision dumps are on (msprobe refuses TorchDynamo)
    allow_compile: bool
    # distillation.enabled: the loss's settings (the core's DistillationSpec), else None; the teacher is a role
    distillation: Any = None
    # reward_model.enable with a causal LM: the reward model is a judge (npu_rl/workers/judge.py), not a classifier
    reward_judge: bool = False
    # reward_model.reward_manager=prime: PRIME's settings (npu_rl.trainer.checks.prime.PrimeSpec), else None; the
    # implicit PRM is the role "prm" (reward_model.enable), not a reward model that replaces the score
    prime: Any = None
    # data.apply_chat_template_kwargs: the agent loops render later turns with the same template settings as the prompt
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict, hash=False)
    # what the plan reads differently from the keys as written (verl's global micro-batch sizes, uneven micro-batches,
    # log-probs turned on): one line each, printed at start-up
    notes: tuple[str, ...] = field(default=(), compare=False)


def _node(config: PPOConfig, path: str):
    node = config
    for part in path.split("."):
        node = getattr(node, part)
    return node


def _as_int(value) -> int | None:
    """An int from a resolved config value (None stays None; what is not a number is left to validation)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _micro_batches(config: PPOConfig, notes: list[str]) -> MicroBatchSizes:
    world = world_size(config)
    sizes = {}
    for path, global_key, per_gpu_key, sp_path, name in GLOBAL_MICRO_BATCH_KEYS:
        node = _node(config, path)
        per_gpu, total = _as_int(getattr(node, per_gpu_key)), _as_int(getattr(node, global_key))
        if per_gpu is not None or total is None:
            sizes[name] = per_gpu  # both set: plan_problems asks for one of the two
            continue
        sp = _as_int(_node(config, sp_path).ulysses_sequence_parallel_size) if sp_path else 1
        ranks = max(world // max(sp or 1, 1), 1)
        sizes[name] = max(total // ranks, 1)
        notes.append(f"{path}.{global_key}={total} is global (verl's deprecated key): {sizes[name]} per rank over "
                     f"{ranks} data-parallel rank(s), i.e. {path}.{per_gpu_key}={sizes[name]}")
    return MicroBatchSizes(**sizes)


def _uneven_micro_batches(config: PPOConfig, micro: MicroBatchSizes, use_critic: bool) -> list[str]:
    """A per-rank mini-batch that is not a multiple of the micro-batch size runs, as in verl: the last micro-batch of
    each mini-batch is smaller (the loss is aggregated with global denominators, so the gradient is the same)."""
    arr, world = config.actor_rollout_ref, world_size(config)
    roles = [("actor_rollout_ref.actor", arr.actor, micro.actor_update)]
    if use_critic:
        roles.append(("critic", config.critic, micro.critic_update))
    notes = []
    for key, role, size in roles:
        mini, sp = _as_int(role.ppo_mini_batch_size), _as_int(role.ulysses_sequence_parallel_size) or 1
        if (role.use_dynamic_bsz is True or size is None or mini is None or size <= 0 or sp <= 0 or world <= 0
                or world % sp):  # 0 devices: the checks refuse it, naming the key
            continue
        rows, dp = mini * arr.rollout.n, world // sp
        if rows % dp or (rows // dp) % size == 0:
            continue
        per_rank = rows // dp
        notes.append(f"{key}: the {per_rank} rows per rank of a mini-batch are not a multiple of "
                     f"ppo_micro_batch_size_per_gpu={size}; as in verl, the last micro-batch holds {per_rank % size} "
                     "(the loss uses the mini-batch's global token and sequence counts, so the gradient is unchanged)")
    return notes


def _role_settings(world: int, sp: int, mini_batch_size: int, n: int) -> RoleSettings:
    dp = max(world // max(sp, 1), 1)
    return RoleSettings(dp_size=dp, sp_size=sp, rows_per_mini_batch=mini_batch_size * n // dp)


def derive_run_settings(config: PPOConfig, needs: frozenset[str], bypass_correction: Any,
                        distillation: Any = None, reward_judge: bool = False, prime: Any = None) -> RunSettings:
    """The plan of a config (see :func:`plan_problems` for the checks behind each number). ``needs``: what the
    advantage estimator reads (``npu_rl.core.estimator_needs``); ``bypass_correction``: the core's settings of
    ``algorithm.rollout_correction`` in bypass mode, else None. ``npu_rl.trainer.preflight.run_settings_for`` passes both."""
    arr = config.actor_rollout_ref
    world, n = world_size(config), arr.rollout.n
    notes: list[str] = []
    micro = _micro_batches(config, notes)
    use_critic = critic_enabled(config, needs)
    notes += _uneven_micro_batches(config, micro, use_critic)
    rollout_logprobs = bool(arr.rollout.calculate_log_probs) or needs_rollout_logprobs(config)
    if rollout_logprobs and not arr.rollout.calculate_log_probs:
        notes.append("algorithm.rollout_correction needs the rollout's log-probs: they are returned as with "
                     "actor_rollout_ref.rollout.calculate_log_probs=True")
    critic = None
    if use_critic:
        critic = _role_settings(world, config.critic.ulysses_sequence_parallel_size, config.critic.ppo_mini_batch_size, n)
    return RunSettings(
        world_size=world,
        rollout_n=n,
        train_rows=config.data.train_batch_size * n,
        max_prompt_length=config.data.max_prompt_length,
        max_response_length=config.data.max_response_length,
        logprob_temperature=arr.rollout.temperature,
        seed=config.trainer.seed,
        use_critic=use_critic,
        use_ref=ref_enabled(config),
        ref_in_actor=ref_enabled(config) and arr.model.lora_rank > 0,
        use_reward_model=bool(config.reward_model.enable) and prime is None,
        use_greedy_baseline="reward_baselines" in needs,
        policy_model_path=arr.model.path,
        actor=_role_settings(world, arr.actor.ulysses_sequence_parallel_size, arr.actor.ppo_mini_batch_size, n),
        critic=critic,
        micro_batches=micro,
        rollout_logprobs=rollout_logprobs,
        chat_template_kwargs=dict(config.data.apply_chat_template_kwargs or {}),
        policy_loss_mode=policy_loss_mode(config),
        bypass_correction=bypass_correction if config.algorithm.rollout_correction.bypass_mode else None,
        allow_compile=not uses_precision_debugger(config),
        distillation=distillation,
        reward_judge=reward_judge,
        prime=prime,
        notes=tuple(notes),
    )


def run_settings_problems(config: PPOConfig, run_settings: RunSettings) -> list[str]:
    """Every split of the step's rows must come out even: prompts -> mini-batches -> ranks -> micro-batches."""
    problems: list[str] = []
    arr = config.actor_rollout_ref
    n = arr.rollout.n
    world = world_size(config)
    if world < 1:
        return []  # TrainerConfig.check names nnodes / n_gpus_per_node; nothing divides over no device
    sp = arr.actor.ulysses_sequence_parallel_size
    if sp < 1 or world % sp:
        return [f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp} must divide the number of devices "
                f"({world} = trainer.nnodes x trainer.n_gpus_per_node)"]
    dp = world // sp
    tp = arr.rollout.tensor_model_parallel_size
    if not (1 <= tp <= world and world % tp == 0):
        problems.append(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} must divide the {world} device(s) "
                        "(trainer.nnodes x trainer.n_gpus_per_node); on one device set it to 1")
    rows = config.data.train_batch_size * n
    if rows % dp:
        problems.append(f"data.train_batch_size x rollout.n = {rows} rows must divide evenly over {dp} data-parallel "
                        "ranks")
    roles = [("actor_rollout_ref.actor", arr.actor, run_settings.micro_batches.actor_update)]
    if run_settings.use_critic:
        roles.append(("critic", config.critic, run_settings.micro_batches.critic_update))
    for key, role, micro in roles:
        problems += _role_problems(config, key, role, micro, world)
    return problems


def _role_problems(config: PPOConfig, key: str, role, micro: int | None, world: int) -> list[str]:
    n = config.actor_rollout_ref.rollout.n
    role_sp = role.ulysses_sequence_parallel_size
    if role_sp < 1 or world % role_sp:
        return [f"{key}.ulysses_sequence_parallel_size={role_sp} must divide the number of devices ({world})"]
    dp = world // role_sp
    fsdp_key, fsdp = (f"{key}.fsdp_config", role.fsdp_config) if hasattr(role, "fsdp_config") else \
        (f"{key}.model.fsdp_config", role.model.fsdp_config)  # the critic keeps it under model
    ep = fsdp.expert_parallel_size
    if ep < 1 or world % ep:
        return [f"{fsdp_key}.expert_parallel_size={ep} must divide the number of devices ({world})"]
    if ep > 1 and fsdp.fsdp_size not in (-1, world):
        return [f"{fsdp_key}.expert_parallel_size={ep} with fsdp_size={fsdp.fsdp_size} (HSDP) is not supported: "
                "set fsdp_size to -1"]
    mini = role.ppo_mini_batch_size
    if mini <= 0:
        return [f"{key}.ppo_mini_batch_size must be > 0"]
    problems = []
    if config.data.train_batch_size % mini:
        problems.append(f"data.train_batch_size={config.data.train_batch_size} must be a multiple of "
                        f"{key}.ppo_mini_batch_size={mini}")
    mini_rows = mini * n
    if mini_rows % dp:
        return problems + [f"{key}.ppo_mini_batch_size x rollout.n = {mini_rows} must divide over {dp} ranks"]
    per_rank = mini_rows // dp
    if role.ppo_micro_batch_size is not None and role.ppo_micro_batch_size_per_gpu is not None:
        problems.append(f"set only one of {key}.ppo_micro_batch_size (deprecated) and {key}.ppo_micro_batch_size_per_gpu")
    if role.use_dynamic_bsz:
        # With Ulysses each rank holds 1/sp of a sequence, so the budget covers sp times more tokens.
        need = config.data.max_prompt_length + config.data.max_response_length
        if role.ppo_max_token_len_per_gpu * role_sp < need:
            problems.append(f"{key}.ppo_max_token_len_per_gpu={role.ppo_max_token_len_per_gpu} x ulysses_sequence_"
                            f"parallel_size={role_sp} is below one sequence's maximum length ({need} = "
                            "data.max_prompt_length + data.max_response_length)")
    elif micro is not None and not micro > 0:
        # a per-rank mini-batch that is not a multiple of micro runs with a smaller last micro-batch, as in verl
        # (the plan's notes say so)
        problems.append(f"{key}.ppo_micro_batch_size_per_gpu={micro} must be > 0 (the {per_rank} rows per rank of a "
                        "mini-batch are split into micro-batches of this many rows)")
    return problems
