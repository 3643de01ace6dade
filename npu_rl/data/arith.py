"""A generated arithmetic task: the embedded default run's data (no download, learnable on a laptop CPU).

Problems are ``a op b [op c ...]`` with integer operands of ``min_digits``..``max_digits`` digits (1 digit means
0-9) and operators drawn from ``operators`` (``+ - *``, Python precedence). The test split is held out: no problem
text appears in both splits. When the space of distinct problems is small (1-digit addition has 10 x 10 = 100),
every problem is enumerated, shuffled with ``seed`` and split; the test split then takes at most a quarter of the
space and the train split the rest. Larger spaces are sampled without replacement. The same spec and seed always
give the same rows.

The default (two 1-digit operands, ``+``) is what SmolLM2-135M-Instruct gets roughly half right greedily, so GRPO
has mixed-reward groups to learn from; see docs/data_and_rewards.md for the measured rate.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import asdict, dataclass
from typing import Any, Optional

DATA_SOURCE = "arith"
PROMPT_TEMPLATE = "What is {expression}? Give only the answer."
_ENUMERATE_LIMIT = 20_000  # spaces up to this size are enumerated exactly
_OPERATORS = ("+", "-", "*")


MAX_ROWS = 1_000_000  # per split
MAX_OPERANDS = 16


@dataclass(frozen=True)
class ArithSpec:
    num_operands: int = 2
    operators: str = "+"  # the operators to draw from, e.g. "+-*"
    min_digits: int = 1
    max_digits: int = 1
    num_train: int = 1000  # capped by the number of distinct problems
    num_test: int = 100  # capped at a quarter of the distinct problems
    seed: int = 0
    prompt_template: str = PROMPT_TEMPLATE

    def __post_init__(self):
        if not 2 <= self.num_operands <= MAX_OPERANDS:
            raise ValueError(f"arith: num_operands must be in [2, {MAX_OPERANDS}], got {self.num_operands}")
        bad = [op for op in self.operators if op not in _OPERATORS]
        if not self.operators or bad:
            raise ValueError(f"arith: operators {self.operators!r} must be a non-empty string of {''.join(_OPERATORS)}")
        if not 1 <= self.min_digits <= self.max_digits <= 18:
            raise ValueError(f"arith: need 1 <= min_digits <= max_digits <= 18, got {self.min_digits}, {self.max_digits}")
        if self.num_train < 1 or self.num_test < 1:
            raise ValueError(f"arith: num_train and num_test must be >= 1, got {self.num_train}, {self.num_test}")
        if self.num_train > MAX_ROWS or self.num_test > MAX_ROWS:  # checked before anything is generated
            raise ValueError(f"arith: num_train and num_test must be <= {MAX_ROWS:,} (a generated set is made in "
                             f"memory at start-up), got {self.num_train}, {self.num_test}")
        if "{expression}" not in self.prompt_template:
            raise ValueError("arith: prompt_template must contain '{expression}'")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def operand_values(self) -> list[range]:
        return [range(0 if d == 1 else 10 ** (d - 1), 10**d) for d in range(self.min_digits, self.max_digits + 1)]

    def space_size(self) -> int:
        num_values = sum(len(r) for r in self.operand_values())
        return num_values**self.num_operands * len(set(self.operators)) ** (self.num_operands - 1)

    def split_sizes(self) -> tuple[int, int]:
        space = self.space_size()
        num_test = min(self.num_test, max(1, space // 4))
        num_train = min(self.num_train, space - num_test)
        if num_train < 1:
            raise ValueError(f"arith: only {space} distinct problems; too few for a train and a test split")
        return num_train, num_test


def _expression(operands: tuple[int, ...], operators: tuple[str, ...]) -> str:
    parts = [str(operands[0])]
    for op, value in zip(operators, operands[1:]):
        parts += [op, str(value)]
    return " ".join(parts)


def _evaluate(expression: str) -> int:
    # Only digits, spaces and + - * ever reach here (built above), so eval is safe; it gives Python precedence.
    return int(eval(expression, {"__builtins__": {}}, {}))  # noqa: S307


def _enumerate(spec: ArithSpec) -> list[str]:
    values = [v for r in spec.operand_values() for v in r]
    ops = sorted(set(spec.operators))
    return [
        _expression(operands, operators)
        for operands in itertools.product(values, repeat=spec.num_operands)
        for operators in itertools.product(ops, repeat=spec.num_operands - 1)
    ]


def _sample(spec: ArithSpec, count: int, rng: random.Random) -> list[str]:
    ranges = spec.operand_values()
    ops = sorted(set(spec.operators))
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < count:
        # a digit count uniformly, then a value of that many digits uniformly
        operands = tuple(rng.choice(rng.choice(ranges)) for _ in range(spec.num_operands))
        operators = tuple(rng.choice(ops) for _ in range(spec.num_operands - 1))
        expression = _expression(operands, operators)
        if expression not in seen:
            seen.add(expression)
            out.append(expression)
    return out


def generate_arith(spec: Optional[ArithSpec] = None) -> dict[str, list[dict[str, Any]]]:
    """``{"train": rows, "test": rows}`` in the verl schema; deterministic in ``spec``."""
    spec = spec or ArithSpec()
    num_train, num_test = spec.split_sizes()
    rng = random.Random(spec.seed)
    if spec.space_size() <= _ENUMERATE_LIMIT:
        expressions = _enumerate(spec)
        rng.shuffle(expressions)
    else:
        expressions = _sample(spec, num_test + num_train, rng)
    splits = {"test": expressions[:num_test], "train": expressions[num_test : num_test + num_train]}
    return {split: [_row(spec, split, i, e) for i, e in enumerate(exprs)] for split, exprs in splits.items()}


def _row(spec: ArithSpec, split: str, index: int, expression: str) -> dict[str, Any]:
    answer = str(_evaluate(expression))
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": spec.prompt_template.format(expression=expression)}],
        "ability": "arith",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "expression": expression, "answer": answer},
    }
