"""The package list in pyproject.toml matches the tree; kernels/ imports under a non-clashing name."""

from __future__ import annotations

import os
import tomllib

from tests.conftest import REPO_ROOT


def test_every_subpackage_is_listed():
    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    found = {"npu_rl_kernels", "npu_rl.configs"}
    for root, _, files in os.walk(os.path.join(REPO_ROOT, "npu_rl")):
        if "__init__.py" in files:
            found.add(os.path.relpath(root, REPO_ROOT).replace(os.sep, "."))
    for root, _, files in os.walk(os.path.join(REPO_ROOT, "kernels")):
        if "__init__.py" in files and "__pycache__" not in root:
            found.add(os.path.relpath(root, REPO_ROOT).replace(os.sep, ".").replace("kernels", "npu_rl_kernels", 1))
    assert listed == found, f"pyproject lists {sorted(listed - found)} extra, misses {sorted(found - listed)}"


def test_kernels_import_name():
    import npu_rl_kernels

    assert os.path.samefile(os.path.dirname(npu_rl_kernels.__file__), os.path.join(REPO_ROOT, "kernels"))
