"""Tools an agent loop can call: the interface, the config file loader and the built-ins (calculator, GSM8K)."""

from npu_rl.agent.tools.base import BaseTool, FunctionSchema, ToolResponse
from npu_rl.agent.tools.config import ToolConfigError, load_tools

__all__ = ["BaseTool", "FunctionSchema", "ToolResponse", "ToolConfigError", "load_tools"]
