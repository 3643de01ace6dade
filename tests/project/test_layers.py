"""The package's import arrows point down: each room sits on a floor, and a module imports only from its
own room or from rooms on lower floors, lazy imports inside functions included; and there is no import cycle
anywhere in ``npu_rl/`` and in the top-level ``kernels/`` and ``configs/`` (imported as ``npu_rl.kernels`` and
``npu_rl.configs``)."""

from __future__ import annotations

import ast
import pathlib

import npu_rl
import npu_rl.configs
import npu_rl.kernels

# Where each importable tree lives: npu_rl/, and the top-level kernels/ and configs/ (wherever the install put them).
TREES = {
    "npu_rl": pathlib.Path(npu_rl.__file__).parent,
    "npu_rl.kernels": pathlib.Path(npu_rl.kernels.__file__).parent,
    "npu_rl.configs": pathlib.Path(npu_rl.configs.__file__).parent,
}

# Bottom first. Rooms on one floor do not import each other. A room is the second part of a module's name
# (``npu_rl.config.schema`` -> ``config``; ``npu_rl.cli`` -> ``cli``).
FLOORS = [
    ("utils", "configs"),
    ("config", "protocol"),
    ("device", "tracking", "compat"),
    ("core", "kernels", "data"),
    ("parallel", "reward"),
    ("models", "controller"),
    ("rollout", "plan"),
    ("agent",),
    ("workers",),
    ("trainer",),
    ("commands", "api", "experimental"),
    ("cli",),
]
FLOOR = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for prefix, folder in TREES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            found[".".join((prefix,) + (parts[:-1] if parts[-1] == "__init__" else parts))] = path
    return found


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


def _room(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def test_the_top_level_folders_are_seen():
    assert {"npu_rl.kernels", "npu_rl.kernels.policy_kl", "npu_rl.configs", "npu_rl.cli"} <= set(MODULES)


def test_every_room_has_a_floor():
    rooms = {_room(name) for name in MODULES} - {""}
    assert rooms <= set(FLOOR), f"rooms without a floor in FLOORS: {sorted(rooms - set(FLOOR))}"


def _upward_imports() -> set[tuple[str, str]]:
    found = set()
    for name, path in MODULES.items():
        here = _room(name)
        if not here:
            continue  # npu_rl/__init__.py: the package's own front door may reach any room (lazily)
        for target in _imports(path):
            there = _room(target)
            if there and there != here and FLOOR[there] >= FLOOR[here]:
                found.add((name, target))
    return found


def test_no_import_runs_up_a_floor():
    up = sorted(_upward_imports())
    assert not up, "imports that run up (or across) a floor:\n" + "\n".join(
        f"  {a} (floor {FLOOR[_room(a)]}) -> {b} (floor {FLOOR[_room(b)]})" for a, b in up)


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
