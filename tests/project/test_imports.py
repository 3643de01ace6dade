"""A file's head says what it uses: npu_rl's own modules are imported at the top of a file, except in the places
named below, each for its reason (the CLI's dispatch, a module that imports a heavy optional package at its own
head, the doctor). At most 10% of the imports of npu_rl modules may sit inside functions. The light entry points
(``npu-rl --help``, ``npu-rl train --help``) are checked in tests/e2e/test_cli_light.py."""

from __future__ import annotations

import ast
import pathlib

from tests.conftest import REPO_ROOT

ROOT = pathlib.Path(REPO_ROOT)
TREES = ("npu_rl", "kernels", "configs")

# file -> why its imports of npu_rl modules wait until a function runs
LAZY = {
    "npu_rl/cli.py": "the dispatch: a command's module (torch, transformers ...) is imported only when it runs",
    "npu_rl/commands/doctor.py": "the doctor reports on a broken stack: a module that fails to import is a finding",
    "kernels/linear_ops.py": "npu_rl.kernels.triton_linear imports triton (optional) at its head",
    "kernels/policy_kl.py": "npu_rl.kernels.policy_triton imports triton (optional) at its head",
    "kernels/ascend_lowering.py": "the Triton kernels import triton (triton-ascend on an NPU host) at their head",
    "npu_rl/reward/_pool_worker.py": "math_verify (and sympy) only for the built-in scorers, before the first row",
}


def _imports() -> tuple[int, dict[str, list[int]]]:
    """(imports of npu_rl modules in all, {file: line numbers of those inside a function})."""
    total, inside = 0, {}
    for tree in TREES:
        for path in (ROOT / tree).rglob("*.py"):
            module = ast.parse(path.read_text())
            nested = {id(node) for func in ast.walk(module) if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
                      for node in ast.walk(func) if isinstance(node, (ast.Import, ast.ImportFrom))}
            for node in ast.walk(module):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = ["." if node.level else (node.module or "")]
                else:
                    continue
                ours = sum(1 for name in names if name.startswith(("npu_rl", ".")))
                total += ours
                if ours and id(node) in nested:
                    inside.setdefault(str(path.relative_to(ROOT)), []).append(node.lineno)
    return total, inside


def test_imports_of_our_modules_sit_at_the_head():
    total, inside = _imports()
    unexplained = {f"{path}:{lines}" for path, lines in inside.items() if path not in LAZY}
    assert not unexplained, ("npu_rl modules imported inside a function, in a file with no reason in LAZY (move the "
                             f"import to the file's head): {sorted(unexplained)}")
    count = sum(len(lines) for lines in inside.values())
    assert count <= 0.10 * total, f"{count} of {total} imports of npu_rl modules sit inside functions (at most 10%)"


def test_every_named_file_still_needs_its_reason():
    _, inside = _imports()
    stale = sorted(set(LAZY) - set(inside))
    assert not stale, f"LAZY names files with no import inside a function any more: {stale}"
