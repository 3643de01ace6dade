"""Everything importable is inside ``npu_rl/``: the install finds the same packages as the checkout, and ships the
presets (YAML) and data sets with them."""

from __future__ import annotations

import os
import tomllib

from tests.conftest import REPO_ROOT


def test_only_npu_rl_is_importable_from_the_checkout():
    """No top-level folder beside npu_rl/ holds Python to import (kernels/ and configs/ live inside the package)."""
    stray = [name for name in os.listdir(REPO_ROOT)
             if os.path.isfile(os.path.join(REPO_ROOT, name, "__init__.py")) and name not in ("npu_rl", "tests")]
    assert not stray, f"top-level packages outside npu_rl/: {stray}"


def test_setuptools_finds_the_whole_package():
    from setuptools import find_packages

    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        find = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]
    found = set(find_packages(REPO_ROOT, include=find["include"]))
    expected = {os.path.relpath(root, REPO_ROOT).replace(os.sep, ".")
                for root, _, files in os.walk(os.path.join(REPO_ROOT, "npu_rl")) if "__init__.py" in files}
    assert found == expected
    assert {"npu_rl.kernels", "npu_rl.configs", "npu_rl.commands"} <= found


def test_presets_ship_as_package_data():
    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        data = tomllib.load(f)["tool"]["setuptools"]["package-data"]
    assert "*.yaml" in data["npu_rl.configs"]
    assert os.path.isfile(os.path.join(REPO_ROOT, "npu_rl", "configs", "quickstart.yaml"))


def test_kernels_import_from_the_package():
    import npu_rl.kernels

    assert os.path.samefile(os.path.dirname(npu_rl.kernels.__file__), os.path.join(REPO_ROOT, "npu_rl", "kernels"))
