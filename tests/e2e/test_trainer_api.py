"""The Python API (npu_rl.Trainer): a short script with a reward callable and a list of dicts trains the tiny model;
reward functions go by reference, or pickled when they have no name to import them by."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from npu_rl.api import PickledReward, Trainer, reward_reference
from tests.conftest import REPO_ROOT

# The user's script: 10 lines from the import to the print.
SCRIPT = textwrap.dedent("""\
    import json, sys
    from npu_rl import Trainer
    def sevens(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        return solution_str.count("7") / max(len(solution_str), 1)
    if __name__ == "__main__":
        rows = [{"prompt": f"What is {i} + 3?", "answer": str(i + 3)} for i in range(8)]
        result = Trainer(model=sys.argv[1], reward_funcs=[sevens], train_dataset=rows,
                         config=json.loads(sys.argv[2]), output_dir=sys.argv[3]).train()
        print(json.dumps({"step": result.global_step, "checkpoint": result.checkpoint, "run_dir": result.run_dir,
                          "score": result.metrics["critic/score/mean"], "rows": len(result.history)}))
    """)

SMALL = {  # sizes for the tiny model on a CPU (the quickstart's are for SmolLM2)
    "data": {"train_batch_size": 4, "max_prompt_length": 96, "max_response_length": 8},
    "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 4,
                                    "use_torch_compile": False, "optim": {"lr": 1e-3}},
                          "rollout": {"name": "hf", "n": 4, "log_prob_micro_batch_size_per_gpu": 8},
                          "ref": {"log_prob_micro_batch_size_per_gpu": 8}},
    "reward_model": {"num_workers": 1},  # the reward callable runs in the process pool: found by reference there
    "trainer": {"total_training_steps": 2, "save_freq": 2, "logger": ["console", "file"], "progress_bar": False},
}


def test_a_ten_line_script_trains_the_tiny_model_for_two_steps(tiny_model_dir, tmp_path):
    script = tmp_path / "train_rl.py"
    script.write_text(SCRIPT)
    assert len(SCRIPT.strip().splitlines()) == 10
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO_ROOT)
    out = subprocess.run([sys.executable, str(script), tiny_model_dir, json.dumps(SMALL), str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=600, cwd=str(tmp_path), env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["step"] == 2
    assert result["checkpoint"] == str(tmp_path / "out" / "global_step_2")
    assert os.path.isdir(result["checkpoint"]) and result["run_dir"].startswith(str(tmp_path / "out"))
    assert 0.0 <= result["score"] <= 1.0 and result["rows"] >= 2
    with open(tmp_path / "out" / "data" / "train.parquet", "rb") as f:
        assert f.read(4) == b"PAR1"  # the rows were written where the run's files are


def module_level(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return 1.0


def test_reward_functions_go_by_reference_or_are_pickled(tmp_path):
    assert reward_reference(module_level) == f"{__name__}:module_level"
    lam = reward_reference(lambda data_source, solution_str, ground_truth, extra_info=None: 0.0)
    assert isinstance(lam, PickledReward) and lam.label.endswith("<locals>.<lambda>")

    def local(data_source, solution_str, ground_truth, extra_info=None):
        return 0.0

    assert reward_reference(local).label == "test_reward_functions_go_by_reference_or_are_pickled.<locals>.local"
    file = tmp_path / "rewards.py"
    file.write_text("def f(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    assert reward_reference(f"{file}:f") == f"{file}:f"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        reward_reference(str(tmp_path / "missing.py") + ":f")


# A script whose rewards have no name to import them by: a partial and a function made inside a function; the
# reward pool (another process) scores them from the files the Trainer wrote.
PICKLED_SCRIPT = textwrap.dedent("""\
    import functools, json, sys
    from npu_rl import Trainer
    def count(data_source, solution_str, ground_truth, extra_info=None, char="7", **kwargs):
        return solution_str.count(char) / max(len(solution_str), 1)
    def make(bonus):
        def constant(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
            return bonus
        return constant
    if __name__ == "__main__":
        rows = [{"prompt": f"What is {i} + 3?", "answer": str(i + 3)} for i in range(8)]
        result = Trainer(model=sys.argv[1], reward_funcs=[functools.partial(count, char="7"), make(0.25)],
                         train_dataset=rows, config=json.loads(sys.argv[2]), output_dir=sys.argv[3]).train()
        print(json.dumps({"step": result.global_step, "metrics": result.metrics}))
    """)


def test_a_partial_and_a_nested_function_score_in_the_reward_pool(tiny_model_dir, tmp_path):
    script = tmp_path / "train_pickled.py"
    script.write_text(PICKLED_SCRIPT)
    config = {**SMALL, "trainer": {**SMALL["trainer"], "total_training_steps": 1, "save_freq": -1}}
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO_ROOT)
    out = subprocess.run([sys.executable, str(script), tiny_model_dir, json.dumps(config), str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=600, cwd=str(tmp_path), env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["step"] == 1
    assert sorted(os.listdir(tmp_path / "out" / "reward_funcs")) == ["0-partial(count).pkl",
                                                                     "1-make._locals_.constant.pkl"]
    assert 0.25 <= result["metrics"]["critic/score/mean"] <= 1.25  # 0.25 from the nested function, each row


def test_a_script_that_trains_at_its_top_level_is_refused(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent("""\
        from npu_rl.api import Trainer
        def r(data_source, solution_str, ground_truth, extra_info=None):
            return 0.0
        Trainer(model="x", reward_funcs=[r], train_dataset=[{"prompt": "a", "answer": "b"}]).train()
        """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    assert out.returncode != 0
    assert f"{script}:4 starts training at the top level" in out.stderr and "__name__" in out.stderr


def test_rows_without_a_ground_truth_name_the_row(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="train: row 1 has no ground truth"):
        Trainer(model=tiny_model_dir, reward_funcs=[module_level], output_dir=str(tmp_path),
                train_dataset=[{"prompt": "a", "answer": "1"}, {"prompt": "b"}])
