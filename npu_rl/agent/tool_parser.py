"""Tool calls out of the model's text. ``hermes`` (Qwen2.5 / Hermes / many others)::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12 * 34"}}
    </tool_call>

Every ``<tool_call>`` block becomes a :class:`ToolCall`; a block that is not a JSON object with a string ``name``
and object ``arguments`` (a JSON string holding an object is accepted), or a ``<tool_call>`` never closed, becomes a
call with ``error`` set (nested too deep to read included): the agent loop answers it with an error message and
counts it; nothing raises.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from npu_rl.utils.registry import Registry

_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_HERMES_OPEN = "<tool_call>"


@dataclass
class ToolCall:
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None  # set: malformed; the loop sends this back as the tool's answer
    raw: str = ""


def _parse_block(raw: str) -> ToolCall:
    text = raw.strip()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return ToolCall(error=f"the tool call is not valid JSON ({exc.msg} at character {exc.pos})", raw=raw)
    except RecursionError:  # "[[[[...": deeper than the interpreter's stack
        return ToolCall(error="the tool call is nested too deeply to read", raw=raw)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return ToolCall(error='the tool call must be a JSON object {"name": ..., "arguments": {...}}', raw=raw)
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return ToolCall(name=obj["name"], error="arguments must be a JSON object", raw=raw)
    if not isinstance(arguments, dict):
        return ToolCall(name=obj["name"], error="arguments must be a JSON object", raw=raw)
    return ToolCall(name=obj["name"], arguments=arguments, raw=raw)


def parse_hermes(text: str) -> tuple[str, list[ToolCall]]:
    """(the text without the tool-call blocks, the calls in order)."""
    calls = [_parse_block(m.group(1)) for m in _HERMES_BLOCK.finditer(text)]
    content = _HERMES_BLOCK.sub("", text)
    if _HERMES_OPEN in content:  # an opened block that never closed (e.g. cut at the length limit)
        calls.append(ToolCall(error="<tool_call> was opened but never closed with </tool_call>",
                              raw=content[content.index(_HERMES_OPEN):]))
        content = content[: content.index(_HERMES_OPEN)]
    return content.strip(), calls


TOOL_PARSERS: Registry = Registry("tool call format", "actor_rollout_ref.rollout.multi_turn.format")
TOOL_PARSERS.register("hermes")(parse_hermes)
