"""What a model folder is, read from its config.json (nothing loaded): runs that would be accepted but could not do
what was asked are refused at validation with the reason.

- A vision-language model (a ``vision_config``, or an architecture such as ``Qwen2_5_VLForConditionalGeneration``)
  as the actor: only text is read and generated here; images in the rows would be dropped.
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
    return (f"{key}: {folder} is a vision-language model ({names}); npu-rl trains text-only models (prompts and "
            "responses are text; images are not read), so this run cannot do what it asks. Use a text model, or "
            "verl for vision-language RL")


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
