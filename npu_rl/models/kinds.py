"""What a model folder is, read from its config.json (nothing loaded): runs that would be accepted but could not do
what was asked are refused at validation with the reason.

- A vision-language model (a ``vision_config``, or an architecture such as ``Qwen2_5_VLForConditionalGeneration``)
  as the actor: a Qwen-VL folder (Qwen2-VL / Qwen2.5-VL / Qwen3-VL, with its preprocessor_config.json) is trained
  (docs/vl.md) where the run uses only what is built for it (``vision_language_problems``: no Ulysses, the hf
  rollout, no agent loops); any other vision-language family is refused.
- A generative reward model (a GenRM, as verl's FAPO recipe serves through its reward loop): a checkpoint whose
  architectures are all causal / conditional LMs, given as ``reward_model.model.path``, is served as a judge
  (:func:`is_generative`; npu_rl/reward/judge.py), not scored with a sequence-classification head. A
  ``custom_reward_function`` that takes verl's ``reward_router_address`` (it calls verl's GenRM HTTP router) is
  refused: npu-rl passes the judge as a ``judge`` argument instead.
"""

from __future__ import annotations

import ast
import json
import os
from typing import Optional

from npu_rl.data.images import QWEN_VL_TYPES

_GENERATIVE_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")
_SCORING_SUFFIXES = ("ForSequenceClassification", "ForTokenClassification", "ForRewardModel", "RewardModel")


def _config(folder: str) -> dict:
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def is_vision_language(folder: str) -> bool:
    config = _config(folder)
    names = [str(a) for a in config.get("architectures") or []]
    return "vision_config" in config or any("VL" in a or "Vision" in a or "Llava" in a for a in names)


def is_qwen_vl_folder(folder: str) -> bool:
    return str(_config(folder).get("model_type", "")) in QWEN_VL_TYPES


def actor_model_problem(key: str, folder: str) -> Optional[str]:
    if not is_vision_language(folder):
        return None
    config = _config(folder)
    names = ", ".join(config.get("architectures") or []) or "a vision_config"
    if not is_qwen_vl_folder(folder):
        return (f"{key}: {folder} is a vision-language model ({names}, model_type {config.get('model_type')!r}); "
                f"npu-rl trains the Qwen-VL family only ({', '.join(QWEN_VL_TYPES)}): other families' prompt layout "
                "and position ids are not built. Use a Qwen-VL model, or verl")
    if not os.path.isfile(os.path.join(folder, "preprocessor_config.json")):
        return (f"{key}: {folder} is a vision-language model ({names}) without preprocessor_config.json (its image "
                "processor: patch size, pixel bounds, normalisation); copy it from the base model")
    return None


def image_patch_size_problem(folder: str, image_patch_size: int) -> Optional[str]:
    """``data.image_patch_size`` set (away from verl's default 14) to another patch size than the model's image
    processor uses (its preprocessor_config.json)."""
    try:
        with open(os.path.join(folder, "preprocessor_config.json"), encoding="utf-8") as f:
            patch = json.load(f).get("patch_size")
    except (OSError, ValueError):
        return None  # reported by actor_model_problem
    if image_patch_size == 14 or patch is None or int(patch) == image_patch_size:
        return None
    return (f"data.image_patch_size={image_patch_size}, but {folder}'s image processor (preprocessor_config.json) uses "
            f"patch_size={patch}; the model's own patch size is used: leave data.image_patch_size at 14 or set it "
            f"to {patch}")


def vision_language_problems(key: str, *, sp_sizes: dict[str, int], rollout_name: str,
                             agent_loops: bool, lora_adapter_in_vllm: bool = False) -> list[str]:
    """What a Qwen-VL actor's run asks that is not built for it (docs/vl.md). ``sp_sizes``: each role's Ulysses key
    and its value; ``lora_adapter_in_vllm``: a LoRA actor whose adapter would go to vLLM as an adapter (not merged)."""
    wanted = [
        (size > 1, f"Ulysses ({sp_key}={size}: the sequence split would have to keep each image's tokens whole "
         "where the vision features are scattered, and carry the 3-D rotary ids)",
         f"{sp_key}=1 (model.use_remove_padding=True packs the rows without it)")
        for sp_key, size in sp_sizes.items()
    ] + [
        (rollout_name not in ("hf", "vllm"), f"rollout.name={rollout_name} with images", "rollout.name=hf or vllm"),
        (rollout_name == "vllm" and lora_adapter_in_vllm, "a LoRA adapter served by vLLM (not tested with images)",
         "actor_rollout_ref.model.lora.merge=True (the merged weights go to vLLM) or rollout.name=hf"),
        (agent_loops, "agent-loop rollouts (rollout.mode=async / multi_turn) with images",
         "rollout.mode=sync, multi_turn.enable=False"),
    ]
    return [f"{key} is a Qwen-VL model: {what} is not built for it yet; set {instead}"
            for asked, what, instead in wanted if asked]


def is_generative(folder: str) -> bool:
    """Whether a model folder's architectures are all causal / conditional LMs (a judge, not a classifier)."""
    names = [str(a) for a in _config(folder).get("architectures") or []]
    return bool(names) and all(a.endswith(_GENERATIVE_SUFFIXES) for a in names)


def _function_args(path: str, name: str) -> Optional[list[str]]:
    """The parameter names of function ``name`` in the Python file ``path``, read from its source (not run)."""
    full = os.path.abspath(os.path.expanduser(path))
    try:
        with open(full, encoding="utf-8") as f:
            tree = ast.parse(f.read(), full)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return [a.arg for a in node.args.args + node.args.kwonlyargs]
    return None


def reward_function_takes_judge(path: str, name: str) -> bool:
    """Whether the custom reward function has a ``judge`` parameter (it receives the generative reward model)."""
    return "judge" in (_function_args(path, name) or [])


def reward_function_problem(path: str, name: str) -> Optional[str]:
    """A custom reward function that expects verl's GenRM router (``reward_router_address``): read from the source,
    without running it."""
    full = os.path.abspath(os.path.expanduser(path))
    try:
        with open(full, encoding="utf-8") as f:
            tree = ast.parse(f.read(), full)
    except (OSError, SyntaxError, ValueError):
        return None  # the reward loader says what is wrong with the file
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            args = [a.arg for a in node.args.args + node.args.kwonlyargs]
            if "reward_router_address" in args:
                return (f"custom_reward_function {name!r} in {full} takes reward_router_address: it calls verl's "
                        "generative reward model HTTP router (the reward loop), which npu-rl does not run. npu-rl "
                        "serves a causal-LM reward_model.model.path as a judge and passes it to a compute_score "
                        "with a 'judge' parameter (judge.generate([user messages]) -> texts; docs/data_and_rewards.md)")
    return None
