"""A calculator tool: arithmetic on numbers with ``+ - * / // % **`` and parentheses, evaluated by walking the
``ast`` (no ``eval``): names, calls, attributes and every other node are refused, and exponents and magnitudes are
bounded so that ``9**9**9`` cannot hang the rollout."""

from __future__ import annotations

import ast
import operator
from typing import Any, Optional

from npu_rl.agent.tools.base import BaseTool, FunctionSchema, ToolResponse

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**30

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    pass


def safe_eval(expression: str) -> int | float:
    """The value of an arithmetic expression; ``CalculatorError`` for anything else."""
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("^", "**")
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text.replace(",", ""), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an arithmetic expression: {expression!r}") from exc
    return _eval(tree.body)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is larger than {MAX_EXPONENT}")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError as exc:
            raise CalculatorError("division by zero") from exc
        if isinstance(value, complex):
            raise CalculatorError("the result is not a real number")
        if abs(value) > MAX_MAGNITUDE:
            raise CalculatorError(f"the result is larger than {MAX_MAGNITUDE:.0e}")
        return value
    raise CalculatorError(f"unsupported element {type(node).__name__}: only numbers, + - * / // % ** and "
                          "parentheses are allowed")


def format_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.10g}"
    return str(value)


class CalculatorTool(BaseTool):
    """``calculator(expression)`` -> the value as text; a bad expression returns an error text (no reward)."""

    @classmethod
    def default_schema(cls) -> Optional[FunctionSchema]:
        return FunctionSchema(
            name="calculator",
            description="Evaluate an arithmetic expression (numbers, + - * / // % ** and parentheses).",
            parameters={"type": "object",
                        "properties": {"expression": {"type": "string", "description": "e.g. 123 * 456"}},
                        "required": ["expression"]})

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        try:
            value = safe_eval(parameters.get("expression", ""))
        except CalculatorError as exc:
            return ToolResponse(f"Error: {exc}"), 0.0, {"calculator_error": 1.0}
        return ToolResponse(format_number(value)), 0.0, {}
