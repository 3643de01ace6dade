"""A generative reward model's keys, and a custom reward function that takes the judge (trainer/checks/judge.py)."""

from __future__ import annotations

import pytest

from npu_rl.config.errors import ConfigError
from npu_rl.trainer.preflight import load_checked, run_settings_for
from tests.trainer.conftest import base_overrides


def _config(model_dir, tmp_path, *extra):
    return load_checked(base_overrides(model_dir, str(tmp_path / "run")) + ["algorithm.adv_estimator=grpo"] + list(extra),
                        "ppo_trainer")


def _judge(path):
    return ["reward_model.enable=True", f"reward_model.model.path={path}"]


def _reward(tmp_path, body: str) -> str:
    path = tmp_path / "reward.py"
    path.write_text(body)
    return str(path)


TAKES_JUDGE = "def compute_score(data_source, solution_str, ground_truth, extra_info=None, judge=None):\n    return 0.0\n"


def test_a_causal_lm_reward_model_is_a_judge_with_verls_rollout_keys(tiny_model_dir, tmp_path):
    config = _config(tiny_model_dir, tmp_path, *_judge(tiny_model_dir), "reward.reward_model.rollout.temperature=0.6",
                     "reward_model.rollout.gpu_memory_utilization=0.95", "reward_model.rollout.tensor_model_parallel_size=1")
    assert run_settings_for(config).reward_judge and config.reward_model.rollout.temperature == 0.6


@pytest.mark.parametrize("extra,match", [
    (["reward_model.rollout.name=sglang"], r"reward_model.rollout.name=sglang: .*hf or the vllm engine"),
    (["reward_model.rollout.name=vllm", "trainer.n_gpus_per_node=2", "trainer.device=cpu"],
     r"reward_model.rollout.name=vllm on 2 devices: a vLLM judge runs in one-device runs only"),
    (["reward_model.rollout.gpu_memory_utilization=1.5"], r"gpu_memory_utilization=1.5 must be in \(0, 1\]"),
    (["reward_model.judge.prompt_template='{problem} only'"], r"has no \{response\}"),
    (["reward_model.judge.score_pattern='[0-9]+'"], r"has no group"),
    (["reward_model.rollout.response_length=0"], r"response_length=0 must be >= 1"),
])
def test_judge_keys_are_checked(tiny_model_dir, tmp_path, extra, match):
    with pytest.raises(ConfigError, match=match):
        _config(tiny_model_dir, tmp_path, *_judge(tiny_model_dir), *extra)


def test_a_function_taking_the_judge_needs_one_in_this_process(tiny_model_dir, tmp_path):
    fn = [f"custom_reward_function.path={_reward(tmp_path, TAKES_JUDGE)}"]
    with pytest.raises(ConfigError, match=r"takes a judge, but the run has no generative reward model"):
        _config(tiny_model_dir, tmp_path, *fn)
    with pytest.raises(ConfigError, match=r"takes a judge, which lives in the trainer's process: set "
                                          r"reward_model.num_workers=0"):
        _config(tiny_model_dir, tmp_path, *fn, *_judge(tiny_model_dir), "reward_model.num_workers=2")
    _config(tiny_model_dir, tmp_path, *fn, *_judge(tiny_model_dir))
