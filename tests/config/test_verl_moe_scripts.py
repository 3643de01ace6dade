"""verl's mixture-of-experts example scripts (copied from verl-project/verl@1dda039, examples/, Apache-2.0) with
only the module changed: the FSDP one loads and passes validation on a tiny Qwen3-MoE; the Megatron ones are
refused with reasons naming what is missing (the Megatron engine, and for the router replay script the vLLM
engine's routed experts)."""

from __future__ import annotations

import os

import pytest

from npu_rl.compat.verl.script import read_script
from npu_rl.compat.verl.translate import translate_overrides
from npu_rl.config.loader import ConfigError, load_config
from npu_rl.trainer.main_ppo import parse_args
from npu_rl.trainer.preflight import check as validate
from tests.models.moe_models import save_tiny_moe
from tests.helpers import write_verl_parquet

DATA = os.path.join(os.path.dirname(__file__), "data", "verl_moe_scripts")
PATHS = ("data.train_files", "data.val_files", "actor_rollout_ref.model.path")


def problems_of(name: str, files: dict[str, str], env: dict[str, str] | None = None) -> list[str]:
    """Read the script as `npu-rl migrate` does, put local files in place of its model and data paths (nothing
    else changes), load and validate the config; the problems (empty: it would run)."""
    with open(os.path.join(DATA, name)) as f:
        reading = read_script(f.read(), {"HOME": "/home/user", "PWD": "/home/user/verl", **(env or {})})
    assert reading.entry_point == "verl.trainer.main_ppo"
    args, unknown = parse_args(reading.overrides, "ppo_trainer")
    overrides = []
    for text in args.overrides + unknown:
        key = text.lstrip("+").split("=", 1)[0]
        overrides.append(f"{key}={files[key]}" if key in PATHS else text)
    try:  # what the entry point does: verl's keys translated (refusals raised here), loaded, validated
        validate(load_config(translate_overrides(overrides, []), "ppo_trainer"), check_device=False)
    except ConfigError as exc:
        return exc.problems
    return []


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("moe_scripts")
    for name in ("train.parquet", "test.parquet"):
        write_verl_parquet(folder / name)
    model = save_tiny_moe(str(folder / "qwen3_moe"))
    return {"data.train_files": str(folder / "train.parquet"), "data.val_files": str(folder / "test.parquet"),
            "actor_rollout_ref.model.path": model}


def test_qwen3_30b_a3b_fsdp_script_loads_and_passes(files):
    assert problems_of("grpo_trainer_run_qwen3_30b_a3b_fsdp.sh", files) == []


def test_deepseek_v3_671b_megatron_script_is_refused_naming_the_megatron_engine(files):
    found = problems_of("grpo_trainer_run_deepseek_v3_671b_megatron.sh", files)
    # every refusal names one of the script's keys and why: the Megatron engine, or Megatron's optimizer options
    assert found and all("megatron" in p or "extra optimizer arguments are not passed" in p for p in found), found
    assert any(p.startswith("actor_rollout_ref.actor.megatron.expert_model_parallel_size=8: ") and
               "the megatron engine is not supported" in p for p in found), found


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_router_replay_megatron_script_is_refused_with_its_reasons(files, backend):
    found = problems_of("router_replay_run_qwen3_30b_a3b_megatron.sh", files, {"INFER_BACKEND": backend})
    assert any("megatron" in p and "the megatron engine is not supported" in p for p in found), found
    if backend == "sglang":
        assert any(p.startswith("actor_rollout_ref.rollout.name=sglang") for p in found), found
