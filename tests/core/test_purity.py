"""The core stays pure: no host syncs, no collectives, no device names, small files."""

from __future__ import annotations

import ast
import io
import pathlib
import tokenize

import npu_rl.core

CORE = pathlib.Path(npu_rl.core.__file__).parent
FORBIDDEN_CODE = (".item(", ".tolist(", ".cpu(", ".numpy(", "torch.distributed", "torch.cuda", "torch.npu")
FORBIDDEN_STRINGS = ("cuda", "npu")


def code_and_strings(source: str) -> tuple[str, list[str]]:
    """The code without comments and strings, and the string literals (unquoted) on their own."""
    code, strings = [], []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.STRING:
            strings.append(token.string.strip("'\""))
        elif token.type != tokenize.COMMENT:
            code.append(token.string)
    return "".join(code), strings


def test_no_host_syncs_collectives_or_device_names():
    for path in sorted(CORE.glob("*.py")):
        code, strings = code_and_strings(path.read_text())
        for word in FORBIDDEN_CODE:
            assert word not in code, f"{path.name} calls {word}"
        for literal in strings:
            assert literal not in FORBIDDEN_STRINGS, f"{path.name} names the device {literal!r}"


def test_files_and_functions_stay_small():
    for path in sorted(CORE.glob("*.py")):
        source = path.read_text()
        assert len(source.splitlines()) < 600, path.name
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= 60, f"{path.name}:{node.name} has {length} lines"
