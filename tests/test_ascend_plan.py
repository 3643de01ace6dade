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
    ({"torch": "2.10.0", "torch-npu": "2.10.0"}, ["vllm==0.23.0", "vllm-ascend==0.23.0", "triton-ascend==3.2.2"]),
    # vLLM-Ascend present: its own row decides (rc of triton-ascend in the image is kept as it is)
    ({"torch": "2.8.0", "torch-npu": "2.8.0.post2", "vllm-ascend": "0.13.0", "triton-ascend": "3.2.0rc4",
      "numpy": "1.26.4"}, ["vllm==0.13.0"]),
    ({}, ["torch==2.10.0", "torch-npu==2.10.0.post4", "vllm==0.23.0", "vllm-ascend==0.23.0",
          "triton-ascend==3.2.2"]),
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
