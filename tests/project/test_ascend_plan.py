"""scripts/ascend_plan.py: what setup.sh keeps and installs on an Ascend node (versions given, nothing installed)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from npu_rl.device import ascend_matrix as matrix
from tests.conftest import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "scripts", "ascend_plan.py")
spec = importlib.util.spec_from_file_location("ascend_plan", SCRIPT)
plan = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plan)

NONE = dict.fromkeys(plan.STACK)


def test_image_with_the_whole_stack_installs_nothing_and_pins_everything():
    image = {**NONE, "torch": "2.7.1", "torch-npu": "2.7.1.post1", "vllm": "0.11.0", "vllm-ascend": "0.11.0",
             "numpy": "1.26.4", "transformers": "4.57.1"}
    assert plan.missing(image, matrix) == []
    assert plan.constraints(image) == ["torch==2.7.1", "torch-npu==2.7.1.post1", "vllm==0.11.0",
                                       "vllm-ascend==0.11.0", "numpy==1.26.4"]


@pytest.mark.parametrize("have, expected", [
    # an image with torch / torch_npu only: the newest final vLLM-Ascend built for that torch
    ({"torch": "2.7.1", "torch-npu": "2.7.1.post1"}, ["vllm==0.11.0", "vllm-ascend==0.11.0", "numpy<2"]),
    ({"torch": "2.9.0", "torch-npu": "2.9.0", "numpy": "1.26.4"},
     ["vllm==0.18.0", "vllm-ascend==0.18.0", "triton-ascend==3.2.0.dev20260322"]),
    ({"torch": "2.10.0", "torch-npu": "2.10.0"}, ["vllm==0.23.0", "vllm-ascend==0.23.0.post1", "triton-ascend==3.2.2"]),
    # vLLM-Ascend present: its own row decides (rc of triton-ascend in the image is kept as it is)
    ({"torch": "2.8.0", "torch-npu": "2.8.0.post2", "vllm-ascend": "0.13.0", "triton-ascend": "3.2.0rc4",
      "numpy": "1.26.4"}, ["vllm==0.13.0"]),
    ({}, ["torch==2.10.0", "torch-npu==2.10.0.post4", "vllm==0.23.0", "vllm-ascend==0.23.0.post1",
          "triton-ascend==3.2.2"]),
    # images with releases the matrix does not list exactly: the nearest row, or the newest for newer releases
    ({"torch": "2.10.0", "torch-npu": "2.10.0.post4", "vllm-ascend": "0.26.0rc2", "numpy": "2.2.0"},
     ["vllm==0.26.0", "triton-ascend==3.2.2"]),
    ({"torch": "2.10.0", "torch-npu": "2.10.0.post4", "vllm-ascend": "0.30.0rc2", "numpy": "2.2.0"},
     ["vllm==0.30.0", "triton-ascend==3.2.2"]),
    ({"torch": "2.10.0", "torch-npu": "2.10.0.post4", "vllm-ascend": "0.33.0", "numpy": "2.2.0"},
     ["vllm==0.30.0", "triton-ascend==3.2.2"]),
])
def test_only_missing_packages_from_the_matching_matrix_row(have, expected):
    assert plan.missing({**NONE, **have}, matrix) == expected


def test_no_row_for_this_torch_fails_clearly():
    with pytest.raises(SystemExit, match="no vLLM-Ascend release in npu-rl's matrix fits torch 2.13.0"):
        plan.missing({**NONE, "torch": "2.13.0+cpu"}, matrix)


def test_script_runs_without_npu_rl_or_torch_imported():
    out = subprocess.run([sys.executable, "-c", f"import runpy, sys; sys.argv=['x','constraints']; "
                          f"runpy.run_path({SCRIPT!r}, run_name='__main__')"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "torch==" in out.stdout, out.stderr
    out = subprocess.run([sys.executable, SCRIPT, "bogus"], capture_output=True, text=True)
    assert out.returncode == 2


def test_rows_for_versions_the_matrix_does_not_list():
    for version, row, checked in [("0.23.0.post1", "0.23.0.post1", True), ("0.23.0.post2", "0.23.0.post1", True),
                                  ("0.26.0rc2", "0.26.0rc1", True), ("0.30.0rc2", "0.30.0rc1", True),
                                  ("0.30.0.dev7", "0.30.0rc1", True), ("0.11.0rc4", "0.11.0rc3", True),
                                  ("0.31.0rc1", "0.30.0rc1", False), ("1.0.0", "0.30.0rc1", False)]:
        found = matrix.match_release(version)
        assert (found.row.vllm_ascend, found.checked) == (row, checked), version
    assert matrix.match_release("0.6.0") is None and matrix.match_release("bogus") is None


def test_newer_release_than_the_matrix_runs_with_a_warning(capsys):
    plan.missing({**NONE, "torch": "2.10.0", "torch-npu": "2.10.0.post4", "vllm-ascend": "0.31.0"}, matrix)
    assert "newer than npu-rl's matrix" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="older than every release"):
        plan.missing({**NONE, "vllm-ascend": "0.6.0"}, matrix)


def test_npu_extra_admits_every_matrix_release_and_nothing_newer_than_any_supports():
    import tomllib

    from packaging.requirements import Requirement

    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        extra = {Requirement(r).name: Requirement(r).specifier
                 for r in tomllib.load(f)["project"]["optional-dependencies"]["npu"]}
    for row in matrix.MATRIX:
        assert extra["torch-npu"].contains(row.torch_npu, prereleases=True), row.torch_npu
        if row.triton_ascend:
            assert extra["triton-ascend"].contains(row.triton_ascend, prereleases=True), row.triton_ascend
    assert not extra["torch-npu"].contains("2.14.0") and not extra["torch-npu"].contains("2.11.0")
    assert extra["triton-ascend"].contains("3.2.0rc4", prereleases=True)  # verl's pin


# ------------------------------------------------------------------------------------------------ bare nodes
INDEX = plan.load_index()


@pytest.mark.parametrize("machine", ["aarch64", "x86_64"])
@pytest.mark.parametrize("row", [r for r in matrix.MATRIX if matrix.parse(r.vllm_ascend) >= matrix.parse("0.11.0")],
                         ids=lambda r: r.vllm_ascend)
def test_each_rows_pins_resolve_against_the_recorded_pypi_files(row, machine):
    """Dry-run resolution of a row's pins on Python 3.11 from the recorded PyPI files (no network): each one is a
    wheel, a source build, or the vendor's index; the bare-node plan names exactly those."""
    sources = {name: plan.pypi_source(INDEX, name, str(matrix.parse(version)), machine, "3.11")
               for name, version in (("torch-npu", row.torch_npu), ("triton-ascend", row.triton_ascend),
                                     ("vllm-ascend", row.vllm_ascend)) if version}
    # the facts of 2026-12-01: torch_npu wheels for both machines except builds only the vendor publishes
    vendor_only = {"2.5.1.post1.dev20250528", "2.5.1.post1.dev20250619", "2.7.1.dev20250724", "2.7.1.post1",
                   "2.8.0.post1", "2.9.0.post1"}
    assert sources["torch-npu"] == ("vendor" if str(matrix.parse(row.torch_npu)) in vendor_only else "wheel")
    if row.triton_ascend:
        assert sources["triton-ascend"] == ("wheel" if row.triton_ascend == "3.2.0" else "vendor"), row
    if matrix.parse(row.vllm_ascend) >= matrix.parse("0.13.0"):
        assert plan.pypi_source(INDEX, "arctic-inference", "0.1.1", machine, "3.11") == "sdist"
    versions = dict(NONE)
    lines = plan.bare_node_plan({**versions, "vllm-ascend": None}, matrix, INDEX, machine, "3.11", False)
    assert lines[-1].endswith("Nothing was installed.")


def test_bare_node_plan_names_what_to_fetch_and_where():
    lines = "\n".join(plan.bare_node_plan(
        {**NONE, "torch": "2.10.0", "torch-npu": "2.10.0.post4"}, matrix, INDEX, "aarch64", "3.11", True))
    assert "quay.io/ascend/vllm-ascend:v0.23.0.post1 (A2) or :v0.23.0.post1-a3 (A3)" in lines
    assert f"--extra-index-url {plan.VENDOR_INDEX} triton-ascend==3.2.2" in lines  # not on PyPI
    assert "--no-binary arctic-inference arctic-inference==0.1.1" in lines  # sdist only
    assert "VLLM_TARGET_DEVICE=empty pip install --no-binary vllm vllm==0.23.0" in lines
    assert "vllm-ascend==0.23.0.post1" in lines and "PyPI has only its source" in lines
    assert "torch-npu==" not in lines  # installed: kept
    assert plan.bare_node_plan({**NONE, "torch": "2.10.0", "torch-npu": "2.10.0.post4", "vllm": "0.23.0",
                                "vllm-ascend": "0.23.0.post1"}, matrix, INDEX, "aarch64", "3.11", True) == []
    # an old release: numpy<2 is a constraint of every install command, so vLLM's own numpy never lands first
    old = plan.bare_node_plan({**NONE, "torch": "2.7.1", "torch-npu": "2.7.1.post1"}, matrix, INDEX, "aarch64",
                              "3.11", True)
    assert all("'numpy<2'" in line for line in old if line.startswith("  pip") or "VLLM_TARGET" in line)
    # torch_npu installed but failing to load (CANN not sourced): stop as well
    assert plan.bare_node_plan({**NONE, "torch": "2.10.0", "torch-npu": "2.10.0.post4", "vllm": "0.23.0",
                                "vllm-ascend": "0.23.0.post1"}, matrix, INDEX, "aarch64", "3.11", False)


def test_setup_sh_on_a_bare_ascend_node_stops_before_installing_anything(tmp_path):
    """A fake npu-smi on PATH (an Ascend node) and a Python without torch_npu (this venv's): setup.sh stops with
    the commands to run, creates no venv and installs nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npu-smi").write_text("#!/bin/sh\necho 'npu-smi 25.0.rc1'\n")
    (bin_dir / "npu-smi").chmod(0o755)
    pip_log = tmp_path / "pip_calls"
    # any `python -m pip` through this shim is recorded: there must be none
    shim = bin_dir / "python3"
    shim.write_text(f"#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = pip ] && echo \"$*\" >> {pip_log}; done\n"
                    f"exec {sys.executable} \"$@\"\n")
    shim.chmod(0o755)
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("NPU_RL_EXTRAS", "NPU_RL_ASCEND", "VIRTUAL_ENV")}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", PYTHON=str(shim), VENV=str(venv))
    out = subprocess.run(["bash", os.path.join(REPO_ROOT, "scripts", "setup.sh")], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "stopped before installing anything" in out.stderr
    assert plan.VENDOR_INDEX in out.stderr and "arctic-inference==0.1.1" in out.stderr
    assert "quay.io/ascend/vllm-ascend:" in out.stderr
    assert not venv.exists() and not pip_log.exists()
