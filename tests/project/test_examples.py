"""Every examples/<algorithm>/run_*.sh composes into a config that validates (paths and device not checked: the
NPU/GPU examples name devices and models this machine does not have)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

EXAMPLES = sorted(glob.glob(os.path.join(REPO_ROOT, "examples", "*", "run_*.sh")))


def test_an_example_per_algorithm_and_device():
    names = {os.path.relpath(p, os.path.join(REPO_ROOT, "examples")) for p in EXAMPLES}
    for algo in ("grpo", "ppo", "dapo", "rloo", "reinforce_plus_plus", "remax", "gspo"):
        for device in ("npu", "gpu"):
            assert f"{algo}/run_qwen2.5-0.5b_gsm8k_{device}.sh" in names


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: os.path.relpath(p, REPO_ROOT))
def test_example_config_is_valid(script):
    from npu_rl.config.loader import load_config
    from npu_rl.trainer.preflight import check

    echo = f"{sys.executable} {os.path.join(REPO_ROOT, 'tests', 'argv_echo.py')}"
    out = subprocess.run(["bash", script], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, NPU_RL_TRAIN=echo))
    assert out.returncode == 0, out.stderr
    argv = json.loads(out.stdout)
    assert argv[:2] == ["--config-name", "ppo_trainer"]
    config = load_config(argv[2:], "ppo_trainer")
    check(config, check_paths=False, check_device=False)
    algo = os.path.basename(os.path.dirname(script))
    assert config.trainer.experiment_name.startswith(algo)
