"""``pip install .`` (a wheel, not the editable install the suite runs against) puts the top-level kernels/ and
configs/ inside the package: npu_rl.kernels and npu_rl.configs import from the installed tree, away from the
checkout, with the presets and the shipped data sets as package data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from tests.conftest import REPO_ROOT

PROBE = """
import json, os, sys
sys.meta_path = [m for m in sys.meta_path if 'editable' not in repr(m).lower()]  # the checkout's editable finder
import importlib.resources as resources
import npu_rl, npu_rl.configs, npu_rl.kernels
print(json.dumps({"files": [npu_rl.__file__, npu_rl.configs.__file__, npu_rl.kernels.__file__],
                  "quickstart": resources.files("npu_rl.configs").joinpath("quickstart.yaml").is_file(),
                  "presets": sorted(p.name for p in resources.files("npu_rl.configs").joinpath("preset").iterdir()),
                  "keys": resources.files("npu_rl.compat.verl").joinpath("keys.yaml").is_file()}))
"""


def test_a_wheel_install_holds_kernels_and_configs(tmp_path):
    source, site = tmp_path / "source", tmp_path / "site"
    for name in ("npu_rl", "kernels", "configs"):  # built from a copy: the build leaves build/ beside its source
        shutil.copytree(os.path.join(REPO_ROOT, name), source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(os.path.join(REPO_ROOT, name), source / name)
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--target", str(site), str(source)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    run = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(site)})
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    for path in found["files"]:
        assert path.startswith(str(site)), path
    assert found["files"][1].endswith(os.path.join("npu_rl", "configs", "__init__.py"))
    assert found["files"][2].endswith(os.path.join("npu_rl", "kernels", "__init__.py"))
    assert found["quickstart"] and found["keys"] and "grpo.yaml" in found["presets"]
