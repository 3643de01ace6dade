"""The package's import arrows point down (STYLE.md): nothing below trainer/ imports from it, and no two modules
import each other."""

from __future__ import annotations

import ast
import pathlib

import npu_rl

PACKAGE = pathlib.Path(npu_rl.__file__).parent
BELOW_TRAINER = ("agent", "core", "parallel", "models", "rollout", "workers", "device", "data", "reward", "config",
                 "controller", "protocol", "utils")


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "configs" not in p.parts}


MODULES = _modules()


def _imports(path: pathlib.Path) -> set[str]:
    """npu_rl modules imported by ``path``, at import time or lazily inside a function (``from pkg import sub``
    counts as importing ``pkg.sub``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("npu_rl")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("npu_rl"):
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & set(MODULES)
            found |= submodules if len(submodules) == len(node.names) else submodules | {node.module}
    return found


def test_nothing_below_the_trainer_imports_from_it():
    for name, path in MODULES.items():
        layer = name.split(".")[1] if "." in name else ""
        if layer not in BELOW_TRAINER:
            continue
        up = sorted(m for m in _imports(path) if m.startswith("npu_rl.trainer"))
        assert not up, f"{name} imports {up}: an arrow back up to the trainer"


def test_no_import_cycles():
    """Lazy imports inside functions count too: deferring an import hides a cycle, it does not remove it. A package's
    ``__init__`` re-exporting its own submodules is the one exception."""
    graph = {name: {m for m in _imports(path) if m in MODULES and m != name} for name, path in MODULES.items()}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt]
                if not all(n == cycle[0] or n.startswith(cycle[0] + ".") or cycle[0].startswith(n + ".")
                           for n in cycle):
                    raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            elif state.get(nxt) is None:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if state.get(name) is None:
            visit(name, [name])
