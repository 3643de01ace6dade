"""What a model folder is, read from its config.json (nothing loaded): runs that would be accepted but could not do
what was asked are refused at validation with the reason.

- A vision-language model (a ``vision_config``, or an architecture such as ``Qwen2_5_VLForConditionalGeneration``)
  as the actor: image rows are read (``npu_rl.data.images``) and the Qwen-VL log-prob forward exists
  (``npu_rl.models.vision``), but the trainer, the rollout engines and the checkpoint paths do not build one yet
  (docs/vl.md), so such a run is refused here rather than failing after the model loads.
- A generative reward model (a GenRM, as verl's FAPO recipe serves through its reward loop): a checkpoint whose
  architectures are all causal / conditional LMs, given as ``reward_model.model.path``. npu-rl scores with a
  sequence-classification head (``AutoModelForSequenceClassification``), which such a checkpoint does not have: it
  would get a random head and score noise. A ``custom_reward_function`` that takes verl's ``reward_router_address``
  (it calls the GenRM server) is refused for the same reason.
"""

from __future__ import annotations

import ast
import json
import os
from typing import Optional

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


def actor_model_problem(key: str, folder: str) -> Optional[str]:
    if not is_vision_language(folder):
        return None
    names = ", ".join(_config(folder).get("architectures") or []) or "a vision_config"
    return (f"{key}: {folder} is a vision-language model ({names}); npu-rl reads image rows and computes a "
            "Qwen-VL actor's log-probs, but training one through npu-rl train (its loading, rollout with images, "
            "checkpoints) is not built yet (docs/vl.md). Use a text model, or verl for vision-language RL")


def reward_model_problem(key: str, folder: str) -> Optional[str]:
    names = [str(a) for a in _config(folder).get("architectures") or []]
    if not names or any(a.endswith(_SCORING_SUFFIXES) for a in names):
        return None
    if all(a.endswith(_GENERATIVE_SUFFIXES) for a in names):
        return (f"{key}: {folder} is a generative model ({', '.join(names)}), i.e. a generative reward model "
                "(GenRM, as in verl's FAPO recipe); npu-rl scores with a sequence-classification head and has no "
                "GenRM serving, so it would score with a random head. Use a classifier reward model "
                "(...ForSequenceClassification), or a rule / custom_reward_function reward")
    return None


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
                        "generative reward model server (the reward loop), which npu-rl does not run. Score with "
                        "the function alone, or with a classifier reward model (reward_model.enable=True)")
    return None
