"""The tool interface (verl's shape) and the OpenAI function schema a tool is described by.

A tool instance serves many conversations: ``create`` opens a per-conversation state (keyed by an instance id, with
the row's ``tools_kwargs[<tool name>]["create_kwargs"]``), ``execute`` runs one call and returns
``(response, step_reward, metrics)``, ``calc_reward`` gives a final reward for the conversation, ``release`` drops
the state. ``execute`` may be ``async def`` or a plain ``def``; ``create``, ``execute`` and ``release`` are each cut at the tool's
``timeout`` (seconds, finite and > 0; :mod:`npu_rl.agent.user_code` runs them off the agents' event loop, so even a
tool that blocks cannot stop the deadline from firing, and a stuck thread is never waited for at shutdown).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from npu_rl.agent.user_code import check_timeout


@dataclass
class ToolResponse:
    text: str = ""


@dataclass(frozen=True)
class FunctionSchema:
    """``{"type": "function", "function": {"name", "description", "parameters"}}`` (OpenAI's tool format)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    @classmethod
    def from_openai(cls, schema: Any, where: str = "tool_schema") -> FunctionSchema:
        if not isinstance(schema, dict):
            raise ValueError(f"{where}: expected a mapping in OpenAI's tool format, got {type(schema).__name__}")
        if schema.get("type", "function") != "function":
            raise ValueError(f"{where}: type must be 'function', got {schema.get('type')!r}")
        function = schema.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise ValueError(f"{where}: needs function.name (a string); got {schema!r:.200}")
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise ValueError(f"{where}: function.parameters must be a JSON-schema mapping")
        return cls(function["name"], str(function.get("description") or ""), _plain(parameters))

    def to_openai(self) -> dict[str, Any]:
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def required(self) -> list[str]:
        return list(self.parameters.get("required") or [])


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class BaseTool:
    """Subclass and override ``execute`` (and ``default_schema`` to make ``tool_schema`` optional in the file)."""

    default_timeout_s = 30.0

    def __init__(self, config: Optional[dict[str, Any]] = None, tool_schema: Optional[FunctionSchema] = None):
        self.config = dict(config or {})
        schema = tool_schema or self.default_schema()
        if schema is None:
            raise ValueError(f"{type(self).__name__} needs a tool_schema (it has no default one)")
        self.tool_schema = schema

        self.timeout_s = check_timeout(self.config.get("timeout", self.default_timeout_s), f"tool {schema.name!r}")
        self._instances: dict[str, dict[str, Any]] = {}

    @classmethod
    def default_schema(cls) -> Optional[FunctionSchema]:
        return None

    @property
    def name(self) -> str:
        return self.tool_schema.name

    async def create(self, instance_id: Optional[str] = None, **kwargs: Any) -> str:
        instance_id = instance_id or uuid.uuid4().hex
        self._instances[instance_id] = dict(kwargs)
        return instance_id

    def state(self, instance_id: str) -> dict[str, Any]:
        return self._instances.setdefault(instance_id, {})

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                      ) -> tuple[ToolResponse | str, Optional[float], dict[str, Any]]:
        raise NotImplementedError(f"{type(self).__name__}.execute")

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)
