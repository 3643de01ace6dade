"""The design card's top level: ``npu_rl/`` beside ``kernels/`` and ``configs/``, which install and import as
``npu_rl.kernels`` and ``npu_rl.configs`` (setup.py's ``package_dir``), presets (YAML) and data sets shipped as
package data. The suite itself runs against the editable install; tests/e2e/test_install.py builds a real one."""

from __future__ import annotations

import os
import tomllib

import npu_rl.configs
import npu_rl.kernels

from tests.conftest import REPO_ROOT

TOP_LEVEL = {"npu_rl.kernels": "kernels", "npu_rl.configs": "configs"}


def test_top_level_holds_the_cards_layout():
    packages = {name for name in os.listdir(REPO_ROOT) if os.path.isfile(os.path.join(REPO_ROOT, name, "__init__.py"))}
    assert packages == {"npu_rl", "kernels", "configs", "tests"}
    for name in ("scripts", "docs", "pyproject.toml", "Dockerfile"):
        assert os.path.exists(os.path.join(REPO_ROOT, name)), name


def test_setup_maps_the_top_level_folders():
    from setuptools import find_packages

    text = open(os.path.join(REPO_ROOT, "setup.py")).read()
    namespace: dict = {}
    exec(compile(text.split("\nsetup(")[0], "setup.py", "exec"), namespace)  # our own file: the mapping it declares
    assert namespace["TOP_LEVEL"] == TOP_LEVEL
    assert {"npu_rl", "npu_rl.commands", "npu_rl.core"} <= set(find_packages(REPO_ROOT, include=["npu_rl", "npu_rl.*"]))


def test_presets_ship_as_package_data():
    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        data = tomllib.load(f)["tool"]["setuptools"]["package-data"]
    assert "*.yaml" in data["npu_rl.configs"]
    assert os.path.isfile(os.path.join(REPO_ROOT, "configs", "quickstart.yaml"))


def test_the_editable_install_maps_the_folders():
    assert os.path.samefile(os.path.dirname(npu_rl.kernels.__file__), os.path.join(REPO_ROOT, "kernels"))
    assert os.path.samefile(os.path.dirname(npu_rl.configs.__file__), os.path.join(REPO_ROOT, "configs"))
