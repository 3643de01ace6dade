"""Interactions: a scripted user that answers the model's turn (verl's ``BaseInteraction`` shape).

``interaction_config_path`` (verl's format)::

    interaction:
      - name: gsm8k                                     # optional; defaults to the class's default name
        class_name: npu_rl.agent.interactions.AnswerCheckInteraction
        config: {}

A row picks one with ``extra_info.interaction_kwargs.name`` (its other entries go to ``start_interaction``).
``generate_response`` returns ``(should_terminate, user_text, turn_score, metadata)``; the text is appended as a
user turn (mask 0) and the score is kept per turn (``turn_scores``). Each call is cut at ``config.timeout`` seconds
(default 30); one that raises, times out or returns anything but that tuple (with a finite score) fails the
sample, named with its row and the interaction (:mod:`npu_rl.agent.runner` counts it).
"""

from __future__ import annotations

import uuid
from typing import Any, Optional

from npu_rl.agent.tools.config import ToolConfigError, load_class, read_yaml_mapping, resolve_config_file
from npu_rl.agent.user_code import check_timeout
from npu_rl.reward.scorers import default_compute_score


class BaseInteraction:
    default_name = "interaction"
    default_timeout_s = 30.0  # each of start_interaction / generate_response / finalize_interaction

    def __init__(self, config: Optional[dict[str, Any]] = None):
        self.config = dict(config or {})
        self.name = str(self.config.get("name", self.default_name))
        self.timeout_s = check_timeout(self.config.get("timeout", self.default_timeout_s),
                                       f"interaction {self.name!r}")
        self._instances: dict[str, dict[str, Any]] = {}

    async def start_interaction(self, instance_id: Optional[str] = None, **kwargs: Any) -> str:
        instance_id = instance_id or uuid.uuid4().hex
        self._instances[instance_id] = dict(kwargs)
        return instance_id

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
                                ) -> tuple[bool, str, float, dict[str, Any]]:
        raise NotImplementedError(f"{type(self).__name__}.generate_response")

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)


class AnswerCheckInteraction(BaseInteraction):
    """Scores the last assistant message with the rule scorer of the row's data source (verl's GSM8K interaction,
    generalised): right -> "Your response is correct!" and stop; wrong -> ask to reflect and try again."""

    default_name = "gsm8k"

    async def generate_response(self, instance_id, messages, **kwargs):
        state = self._instances.get(instance_id, {})
        answer = next((m["content"] for m in reversed(messages) if m.get("role") == "assistant"), "")
        data_source = state.get("data_source", self.config.get("data_source", "openai/gsm8k"))
        result = default_compute_score(data_source, answer, state.get("ground_truth"))
        score = float(result["score"] if isinstance(result, dict) else result)
        if score >= 1.0:
            return True, "Your response is correct!", score, {}
        return False, "Your response is incorrect! You need to reflect on your answer and try again.", score, {}


def load_interactions(path: str) -> dict[str, BaseInteraction]:
    full = resolve_config_file(path)
    data = read_yaml_mapping(path, "multi_turn.interaction_config_path")
    entries = data.get("interaction")
    if not isinstance(entries, list) or not entries:
        raise ToolConfigError(f"multi_turn.interaction_config_path {full}: expected a non-empty list under "
                              "'interaction'")
    out: dict[str, BaseInteraction] = {}
    for i, entry in enumerate(entries):
        where = f"{full}, interaction[{i}]"
        if not isinstance(entry, dict):
            raise ToolConfigError(f"{where}: expected a mapping with name, class_name, config")
        cls = load_class(entry.get("class_name"), BaseInteraction, where)
        config = dict(entry.get("config") or {})
        if entry.get("name"):
            config["name"] = entry["name"]
        try:
            interaction = cls(config)
        except ValueError as exc:
            raise ToolConfigError(f"{where}: {exc}") from exc
        if interaction.name in out:
            raise ToolConfigError(f"{where}: a second interaction named {interaction.name!r}")
        out[interaction.name] = interaction
    return out
