"""verl's tool config file: which tool classes a rollout offers, with their settings and OpenAI schemas.

    tools:
      - class_name: npu_rl.agent.tools.calculator.CalculatorTool   # dotted path, or path/to/file.py:ClassName
        config: {type: native, timeout: 10}                        # passed to the class; timeout in seconds
        tool_schema:                                               # OpenAI function schema (optional when the
          type: function                                           # class has a default one)
          function: {name: calculator, description: ..., parameters: {...}}

The file is read with ``yaml.safe_load`` (no tags, no code); the only code that runs is the module of each named
class. verl's own class names (``verl.tools.gsm8k_tool.Gsm8kTool``) map to the built-in equivalents. Every error
names the file and the entry.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from npu_rl.agent.tools.base import BaseTool, FunctionSchema
from npu_rl.utils.imports import load_object, verl_import_hint

BUILTIN_TOOLS = {
    "calculator": "npu_rl.agent.tools.calculator.CalculatorTool",
    "gsm8k": "npu_rl.agent.tools.gsm8k.Gsm8kTool",
    # verl's class names, so a verl tool config works unchanged
    "verl.tools.gsm8k_tool.Gsm8kTool": "npu_rl.agent.tools.gsm8k.Gsm8kTool",
}


class ToolConfigError(ValueError):
    pass


BUILTIN_PREFIX = "builtin://"


def resolve_config_file(path: str) -> str:
    """A path, or ``builtin://<name>``: the file ``<name>.yaml`` shipped in the package's ``configs/tools/``."""
    if isinstance(path, str) and path.startswith(BUILTIN_PREFIX):
        import importlib.resources

        name = path[len(BUILTIN_PREFIX):].removesuffix(".yaml")
        folder = os.path.join(str(importlib.resources.files("npu_rl.configs")), "tools")
        full = os.path.join(folder, f"{name}.yaml")
        if not os.path.isfile(full):
            known = sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".yaml")) if os.path.isdir(folder) else []
            raise ToolConfigError(f"{path}: no built-in file {name!r}; known: {', '.join(known)}")
        return full
    return os.path.abspath(os.path.expanduser(path))


def read_yaml_mapping(path: str, what: str) -> dict[str, Any]:
    full = resolve_config_file(path)
    if not os.path.isfile(full):
        raise ToolConfigError(f"{what} {full}: no such file")
    with open(full, encoding="utf-8") as f:
        try:
            data = yaml.safe_load(f)
        except yaml.YAMLError as exc:
            raise ToolConfigError(f"{what} {full}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ToolConfigError(f"{what} {full}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def load_class(class_name: Any, base: type, where: str) -> type:
    if not isinstance(class_name, str) or not class_name:
        raise ToolConfigError(f"{where}: class_name must be a dotted path or path/to/file.py:ClassName")
    target = BUILTIN_TOOLS.get(class_name, class_name) if base is BaseTool else class_name
    try:
        cls = load_object(target)
    except (ImportError, AttributeError, ValueError, FileNotFoundError) as exc:
        hint = ""
        if verl_import_hint(exc):  # a verl tool (verl.tools.*, or a recipe's subclass of one)
            hint = (f"; the module imports verl (not installed), and verl's tool classes are not npu-rl tools: a tool "
                    f"here subclasses {BaseTool.__module__}.BaseTool (docs/agents.md; verl's Gsm8kTool maps to the "
                    "built-in one; no sandbox code-execution tool is built in)")
        raise ToolConfigError(f"{where}: cannot load class {class_name!r}: {exc}{hint}") from exc
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ToolConfigError(f"{where}: {class_name!r} is not a subclass of {base.__module__}.{base.__name__}")
    return cls


def load_tools(path: str) -> dict[str, BaseTool]:
    """The tools of a config file, by function name; fails at start-up naming the file and entry."""
    full = resolve_config_file(path)
    data = read_yaml_mapping(path, "multi_turn.tool_config_path")
    entries = data.get("tools")
    if not isinstance(entries, list) or not entries:
        raise ToolConfigError(f"multi_turn.tool_config_path {full}: expected a non-empty list under 'tools'")
    tools: dict[str, BaseTool] = {}
    for i, entry in enumerate(entries):
        where = f"{full}, tools[{i}]"
        if not isinstance(entry, dict):
            raise ToolConfigError(f"{where}: expected a mapping with class_name, config, tool_schema")
        unknown = set(entry) - {"class_name", "config", "tool_schema"}
        if unknown:
            raise ToolConfigError(f"{where}: unknown keys {sorted(unknown)}; expected class_name, config, tool_schema")
        cls = load_class(entry.get("class_name"), BaseTool, where)
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise ToolConfigError(f"{where}: config must be a mapping")
        schema = entry.get("tool_schema")
        try:
            parsed = FunctionSchema.from_openai(schema, f"{where}.tool_schema") if schema is not None else None
            tool = cls(config, parsed)
        except ValueError as exc:
            raise ToolConfigError(f"{where}: {exc}") from exc
        if tool.name in tools:
            raise ToolConfigError(f"{where}: a second tool named {tool.name!r}")
        tools[tool.name] = tool
    return tools
