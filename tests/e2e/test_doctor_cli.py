"""``npu-rl doctor`` as a user runs it, in a process of its own (``python -m npu_rl.cli doctor``): the report on
this machine and the exit status when the chosen device cannot be used. The in-process checks of the same stay in the
default lane (tests/cli/test_cli_help.py, tests/commands/test_doctor.py, tests/device/test_device.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO_ROOT


def test_doctor_runs_here():
    out = subprocess.run([sys.executable, "-m", "npu_rl.cli", "doctor"], capture_output=True, text=True,
                         cwd=REPO_ROOT, env={**os.environ, "DEVICE": ""})
    assert "chosen (DEVICE=" in out.stdout and ": cpu, dist backend gloo" in out.stdout, out.stdout + out.stderr
    assert "torch " in out.stdout and "vllm-ascend" in out.stdout and "CANN" in out.stdout


def test_doctor_exit_code_when_the_chosen_device_is_unusable():
    env = {**os.environ, "DEVICE": "npu", "PYTHONPATH": REPO_ROOT}
    out = subprocess.run([sys.executable, "-m", "npu_rl.cli", "doctor"], capture_output=True, text=True,
                         cwd=REPO_ROOT, env=env)
    assert out.returncode == 2 and "the chosen device cannot be used" in out.stderr, out.stdout + out.stderr
