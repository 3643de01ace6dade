"""verl's asynchronous example scripts (copied from verl-project/verl@1dda039, verl/experimental/*/shell/, Apache-2.0)
load with only the module changed: every key is known; what is not built is refused with the reason."""

from __future__ import annotations

import os

import pytest

from npu_rl.compat.verl.script import read_script
from npu_rl.compat.verl.translate import translate_overrides
from npu_rl.config.async_schema import async_problems
from npu_rl.config.loader import ConfigError, load_config
from npu_rl.experimental import verl_flags
from npu_rl.trainer.main_ppo import parse_args

DATA = os.path.join(os.path.dirname(__file__), "data")
ENTRY = {"verl.experimental.one_step_off_policy.main_ppo": ("one_step_off_ppo_trainer", "one_step_off"),
         "verl.experimental.fully_async_policy.fully_async_main": ("fully_async_ppo_trainer", "fully_async")}


def load_script(name: str, drop: str | None = None):
    """The script's config as its entry point loads it; ``drop``: leave out the overrides of keys starting so."""
    with open(os.path.join(DATA, name)) as f:
        reading = read_script(f.read(), {"DEVICE": "npu", "HOME": "/home/user", "PWD": "/home/user/verl", "NNODES": "1"})
    config_name, mode = ENTRY[reading.entry_point]
    args, unknown = parse_args(verl_flags(reading.overrides), config_name)  # as the entry point reads its flags
    if drop:
        args.overrides = [o for o in args.overrides if not o.lstrip("+~").startswith(drop)]
    assert args.config_path is None and args.config_name == config_name
    # what the entry point adds (npu_rl/experimental/...): the mode; verl's keys translated as the entry point does
    overrides = translate_overrides(args.overrides + unknown + [f"async_training.mode={mode}"], [])
    return load_config(overrides, config_name)


@pytest.mark.parametrize("name", ["one_step_off_grpo_0.6b_gsm8k_fsdp2_2_6.sh",
                                  "one_step_off_grpo_qwen3_8b_gsm8k_fsdp2_8_8_npu.sh"])
def test_one_step_off_scripts_load_and_are_built(name):
    config = load_script(name)
    assert config.async_training.mode == "one_step_off" and not config.actor_rollout_ref.hybrid_engine
    assert config.rollout.n_gpus_per_node >= 1
    assert async_problems(config) == []


def test_fully_async_single_turn_script_is_built_with_partial_rollouts():
    config = load_script("fully_async_dapo_7b_math_fsdp2_4_12.sh")
    assert config.async_training.mode == "fully_async" and config.async_training.partial_rollout
    # verl's fully-async scripts run single-turn rows through its agent loop server (rollout.mode=async); the rollout
    # pool runs them as the plain generation a push interrupts
    assert config.actor_rollout_ref.rollout.mode == "async" and not config.actor_rollout_ref.rollout.multi_turn.enable
    assert async_problems(config) == []


def test_fully_async_multi_turn_script_with_partial_rollouts_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="data.custom_cls.path=.*verl's dataset classes subclass verl's RLHFDataset"):
        load_script("fully_async_dapo_7b_async_retool.sh")  # ReTool's dataset class: refused with the reason
    config = load_script("fully_async_dapo_7b_async_retool.sh", drop="data.custom_cls")
    assert config.async_training.partial_rollout and config.actor_rollout_ref.rollout.multi_turn.enable
    problems = async_problems(config)
    assert any("partial_rollout=True with multi-turn agent loops" in p and "partial_rollout=False" in p
               for p in problems), problems
    config.async_training.partial_rollout = False  # without: agent loops finish in-flight turns, then the push
    assert not any("partial_rollout" in p for p in async_problems(config))


def test_partial_rollouts_take_single_turn_rows_only():
    """Rows naming another loop are refused with the data (row named); the pool runs single-turn rows plainly."""
    from types import SimpleNamespace

    from npu_rl.agent.validate import agent_row_problems
    from npu_rl.protocol import Batch
    from npu_rl.workers.rollout_pool import RolloutPoolWorker

    config = load_script("fully_async_dapo_7b_math_fsdp2_4_12.sh")
    rows = [("train.parquet row 0", {"agent_name": "single_turn_agent"}), ("train.parquet row 1", {}),
            ("train.parquet row 2", {"agent_name": "tool_agent"})]
    problems = agent_row_problems(config, rows)
    assert len(problems) == 1 and problems[0].startswith("train.parquet row 2: agent_name='tool_agent'"), problems
    config.async_training.partial_rollout = False
    assert agent_row_problems(config, rows) == []

    import torch

    worker = SimpleNamespace(agent=object(), rollout_cfg=config.actor_rollout_ref.rollout)
    runs = lambda names, partial: RolloutPoolWorker._runs_agent_loops(  # noqa: E731
        worker, Batch({"input_ids": torch.zeros(len(names), 2)}, {"agent_name": names}), partial)
    assert runs([None, "single_turn_agent"], partial=True) is False  # plain generation, interruptible
    assert runs([None, "single_turn_agent"], partial=False) is True  # the agent loops, as configured
    with pytest.raises(NotImplementedError, match="tool_agent"):
        runs(["tool_agent", None], partial=True)


def test_sync_trainer_notes_async_keys_and_streaming_is_fully_async_only():
    from npu_rl.config.errors import ConfigError
    from npu_rl.config.key_docs import ignored_settings
    from npu_rl.trainer.preflight import check as validate

    config = load_config(["rollout.nnodes=2", "async_training.require_batches=3"], "quickstart")
    notes = ignored_settings(config)
    assert any(n.startswith("rollout.nnodes=2 has no effect with npu_rl.trainer.main_ppo") for n in notes), notes
    assert any(n.startswith("async_training.require_batches=3") for n in notes)
    streaming = load_config(["data.train_batch_size=0"], "quickstart")
    with pytest.raises(ConfigError, match="0 streams: the fully asynchronous trainer only"):
        validate(streaming, check_paths=False, check_device=False)


def test_one_step_off_refuses_a_colocated_run_with_the_reason():
    config = load_config(["async_training.mode=one_step_off", "actor_rollout_ref.hybrid_engine=True"],
                         "one_step_off_ppo_trainer")
    assert any("set actor_rollout_ref.hybrid_engine=False" in p for p in async_problems(config))
