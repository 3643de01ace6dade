"""Numbers and switches derived from the config, worked out once and checked here (nowhere else).

The trainer and the workers read :class:`RunPlan` instead of recomputing ``ppo_mini_batch_size * n // dp`` or asking
whether a critic is needed. :func:`plan_problems` is the validation of the same arithmetic: every split of a step's
rows must come out even (prompts -> mini-batches -> data-parallel ranks -> micro-batches).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from npu_rl.config.schema import PPOConfig


def as_list(value) -> list:
    """A config value that may be one item or a list (``trainer.logger``, ``data.train_files``) as a list."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def world_size(config: PPOConfig) -> int:
    return config.trainer.nnodes * config.trainer.n_gpus_per_node


def critic_enabled(config: PPOConfig) -> bool:
    """``critic.enable`` when set, else whether the advantage estimator reads values (``gae``)."""
    if config.critic.enable is not None:
        return bool(config.critic.enable)
    from npu_rl.core import estimator_needs

    return "values" in estimator_needs(config.algorithm.adv_estimator)


def ref_enabled(config: PPOConfig) -> bool:
    """A reference policy is needed for a KL term: in the loss (``actor.use_kl_loss``) or in the reward."""
    return bool(config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward)


@dataclass(frozen=True)
class RolePlan:
    """How a trained role's step is cut on its ranks."""

    dp_size: int  # data-parallel ranks (devices / ulysses_sequence_parallel_size)
    sp_size: int  # ulysses_sequence_parallel_size
    rows_per_mini_batch: int  # rows of one optimizer step on one rank: ppo_mini_batch_size x rollout.n / dp


@dataclass(frozen=True)
class RunPlan:
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
    actor: RolePlan
    critic: RolePlan | None = None
    # data.apply_chat_template_kwargs: the agent loops render later turns with the same template settings as the prompt
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict, hash=False)
    policy_loss_mode: str = "vanilla"  # actor.policy_loss.loss_mode, or bypass_mode (algorithm.rollout_correction)
    bypass_correction: Any = None  # the bypass_mode loss's RolloutCorrectionSpec (algorithm.rollout_correction)
    ref_in_actor: bool = False  # LoRA: the reference is the actor with its adapter off (no reference worker)
    # torch.compile may be used where the device layer allows it (compiled decoding, compiled blocks); False when
    # msprobe's precision dumps are on (msprobe refuses TorchDynamo)
    allow_compile: bool = True


def _role_plan(world: int, sp: int, mini_batch_size: int, n: int) -> RolePlan:
    dp = max(world // max(sp, 1), 1)
    return RolePlan(dp_size=dp, sp_size=sp, rows_per_mini_batch=mini_batch_size * n // dp)


def build_plan(config: PPOConfig) -> RunPlan:
    """The plan of a validated config (see :func:`plan_problems` for the checks behind each number)."""
    from npu_rl.config.rollout_correction import correction_spec, policy_loss_mode
    from npu_rl.core import estimator_needs
    from npu_rl.config.profiler_schema import uses_precision_debugger

    arr = config.actor_rollout_ref
    world, n = world_size(config), arr.rollout.n
    use_critic = critic_enabled(config)
    critic = None
    if use_critic:
        critic = _role_plan(world, config.critic.ulysses_sequence_parallel_size, config.critic.ppo_mini_batch_size, n)
    return RunPlan(
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
        use_reward_model=bool(config.reward_model.enable),
        use_greedy_baseline="reward_baselines" in estimator_needs(config.algorithm.adv_estimator),
        policy_model_path=arr.model.path,
        actor=_role_plan(world, arr.actor.ulysses_sequence_parallel_size, arr.actor.ppo_mini_batch_size, n),
        critic=critic,
        chat_template_kwargs=dict(config.data.apply_chat_template_kwargs or {}),
        policy_loss_mode=policy_loss_mode(config),
        bypass_correction=correction_spec(config.algorithm.rollout_correction)
        if config.algorithm.rollout_correction.bypass_mode else None,
        allow_compile=not uses_precision_debugger(config),
    )


def plan_problems(config: PPOConfig) -> list[str]:
    """Every split of the step's rows must come out even: prompts -> mini-batches -> ranks -> micro-batches."""
    problems: list[str] = []
    arr = config.actor_rollout_ref
    n = arr.rollout.n
    world = world_size(config)
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
    roles = [("actor_rollout_ref.actor", arr.actor)]
    if critic_enabled(config):
        roles.append(("critic", config.critic))
    for key, role in roles:
        problems += _role_problems(config, key, role, world)
    return problems


def _role_problems(config: PPOConfig, key: str, role, world: int) -> list[str]:
    n = config.actor_rollout_ref.rollout.n
    role_sp = role.ulysses_sequence_parallel_size
    if role_sp < 1 or world % role_sp:
        return [f"{key}.ulysses_sequence_parallel_size={role_sp} must divide the number of devices ({world})"]
    dp = world // role_sp
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
    micro = role.ppo_micro_batch_size_per_gpu
    if micro is None and role.ppo_micro_batch_size is not None:
        micro = role.ppo_micro_batch_size // dp
    if role.use_dynamic_bsz:
        # With Ulysses each rank holds 1/sp of a sequence, so the budget covers sp times more tokens.
        need = config.data.max_prompt_length + config.data.max_response_length
        if role.ppo_max_token_len_per_gpu * role_sp < need:
            problems.append(f"{key}.ppo_max_token_len_per_gpu={role.ppo_max_token_len_per_gpu} x ulysses_sequence_"
                            f"parallel_size={role_sp} is below one sequence's maximum length ({need} = "
                            "data.max_prompt_length + data.max_response_length)")
    elif micro is not None and not micro > 0:
        # a per-rank mini-batch that is not a multiple of micro runs with a smaller last micro-batch, as in verl
        # (the note comes from config.compat)
        problems.append(f"{key}.ppo_micro_batch_size_per_gpu={micro} must be > 0 (the {per_rank} rows per rank of a "
                        "mini-batch are split into micro-batches of this many rows)")
    return problems
