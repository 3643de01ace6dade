"""A generative reward model (``reward_model.enable=True`` with a causal-LM ``reward_model.model.path``): whether the
run has one, and the checks of its keys. Each problem names the key and what to change."""

from __future__ import annotations

from npu_rl.config.derived import world_size
from npu_rl.config.schema import PPOConfig
from npu_rl.models.kinds import is_generative, reward_function_takes_judge
from npu_rl.models.loader import is_builtin, local_model_folder
from npu_rl.reward.judge import pattern_problems, template_problems
from npu_rl.rollout.factory import ROLLOUT_ENGINES

JUDGE_ENGINES = ROLLOUT_ENGINES  # the engines a judge runs on: the rollout engines


def uses_judge(config: PPOConfig) -> bool:
    """``reward_model.enable`` with a causal LM (a built-in model, or a folder whose architectures are all LMs)."""
    rm = config.reward_model
    if not rm.enable or rm.reward_manager == "prime":  # PRIME's causal LM is its implicit PRM, not a judge
        return False
    path = str(rm.model.path)
    if is_builtin(path):
        return True
    folder = local_model_folder(path)
    return folder is not None and is_generative(folder)


def function_takes_judge(config: PPOConfig) -> bool:
    fn = config.custom_reward_function
    return bool(fn.path) and reward_function_takes_judge(str(fn.path), str(fn.name or "compute_score"))


def judge_problems(config: PPOConfig) -> list[str]:
    rm = config.reward_model
    if function_takes_judge(config):
        name = config.custom_reward_function.name or "compute_score"
        if not uses_judge(config):
            return [f"custom_reward_function {name!r} takes a judge, but the run has no generative reward model: set "
                    "reward_model.enable=True and reward_model.model.path=<a causal LM>"]
        if rm.num_workers > 0:
            return [f"custom_reward_function {name!r} takes a judge, which lives in the trainer's process: set "
                    f"reward_model.num_workers=0 (it is {rm.num_workers})"]
    if not uses_judge(config):
        return []
    problems = template_problems(str(rm.judge.prompt_template), "reward_model.judge.prompt_template")
    problems += pattern_problems(str(rm.judge.score_pattern), "reward_model.judge.score_pattern")
    if rm.rollout.name not in JUDGE_ENGINES:
        problems.append(f"reward_model.rollout.name={rm.rollout.name}: a generative reward model runs on the hf or "
                        "the vllm engine here (SGLang is not supported); set reward_model.rollout.name=hf or vllm")
    elif rm.rollout.name == "vllm" and world_size(config) > 1 and not rm.enable_resource_pool:
        problems.append(f"reward_model.rollout.name=vllm on {world_size(config)} devices: a vLLM judge runs in "
                        "one-device runs only (it would need every rank in its engine); use "
                        "reward_model.rollout.name=hf (rank 0 judges), or give it one device of its own "
                        "(reward_model.enable_resource_pool=True, nnodes=1, n_gpus_per_node=1)")
    if not 0 < float(rm.rollout.gpu_memory_utilization) <= 1:
        problems.append(f"reward_model.rollout.gpu_memory_utilization={rm.rollout.gpu_memory_utilization} must be "
                        "in (0, 1]")
    for key in ("prompt_length", "response_length"):
        if int(getattr(rm.rollout, key)) < 1:
            problems.append(f"reward_model.rollout.{key}={getattr(rm.rollout, key)} must be >= 1")
    return problems
