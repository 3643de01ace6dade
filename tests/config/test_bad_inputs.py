"""The bad inputs of issue 19's probe: each is refused at validation naming the key, file and row (or, where it
cannot be known then, counted and warned), instead of a late library traceback or a silently wrong run."""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest

from npu_rl.config.loader import ConfigError
from npu_rl.trainer.preflight import load_checked
from tests.trainer.conftest import base_overrides


def _rows(path, rows) -> str:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return str(path)


def _row(truth, source="arith"):
    return {"data_source": source, "prompt": [{"role": "user", "content": "1 + 1 ="}],
            "reward_model": {"ground_truth": truth}}


def _config(model_dir, tmp_path, *extra):
    return load_checked(base_overrides(model_dir, str(tmp_path / "run")) + list(extra), "ppo_trainer")


@pytest.fixture
def model_copy(tiny_model_dir, tmp_path):
    return shutil.copytree(tiny_model_dir, tmp_path / "model")


def test_a_model_folder_without_tokenizer_files(model_copy, tmp_path):
    os.remove(model_copy / "tokenizer.json")
    with pytest.raises(ConfigError, match=rf"actor_rollout_ref.model.path: {model_copy} has no tokenizer files"):
        _config(str(model_copy), tmp_path)


def test_a_model_folder_with_only_config_json(model_copy, tmp_path):
    os.remove(model_copy / "model.safetensors")
    with pytest.raises(ConfigError, match="has config.json but no weights"):
        _config(str(model_copy), tmp_path)


def test_a_truncated_safetensors_file(model_copy, tmp_path):
    weights = model_copy / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) - 1000)
    with pytest.raises(ConfigError, match=rf"{weights} is truncated"):
        _config(str(model_copy), tmp_path)


@pytest.mark.parametrize("truth", [["2"], {"answer": "2"}, True])
def test_a_ground_truth_that_the_rule_scorers_cannot_read(tiny_model_dir, tmp_path, truth):
    data = _rows(tmp_path / "train.jsonl", [_row("2"), _row(truth)])
    with pytest.raises(ConfigError, match=rf"data.train_files: {data}: row 1: reward_model.ground_truth is a "
                                          rf"{type(truth).__name__}"):
        _config(tiny_model_dir, tmp_path, f"data.train_files={data}")


def test_an_unknown_data_source_is_named_with_file_and_row(tiny_model_dir, tmp_path):
    data = _rows(tmp_path / "val.jsonl", [_row("2"), _row("2", "my/task"), _row("3", "my/task")])
    with pytest.raises(ConfigError, match=rf"data.val_files: {data}: row 1 \(and 1 more rows\): data.reward_fn_key "
                                          r"'data_source' is 'my/task', which has no rule scorer"):
        _config(tiny_model_dir, tmp_path, f"data.val_files={data}")


def test_a_reward_module_that_exits_at_import(tiny_model_dir, tmp_path, capsys):
    module = tmp_path / "exits.py"
    module.write_text("import sys\nsys.exit(0)\n\ndef compute_score(data_source, solution_str, ground_truth, "
                      "extra_info=None):\n    return 0.0\n")
    overrides = base_overrides(tiny_model_dir, str(tmp_path / "run")) + [f"custom_reward_function.path={module}"]
    from npu_rl.trainer.main_ppo import main

    assert main(overrides) == 2  # was: exit 0 having trained nothing
    assert f"importing {module} called sys.exit(0)" in capsys.readouterr().err


def test_sys_exit_inside_a_reward_function_is_a_failed_row(tmp_path):
    from npu_rl.reward.pool import execute
    from npu_rl.reward.score_fn import ScoreFnSpec

    outcome = execute(lambda **kw: __import__("sys").exit(3), ScoreFnSpec(), {})
    assert outcome.status == "error" and "sys.exit(3)" in outcome.error


def test_folders_and_numbers_refused_at_validation(tiny_model_dir, tmp_path):
    (tmp_path / "a_file").write_text("x")
    folder = tmp_path / "data_dir"
    folder.mkdir()
    with pytest.raises(ConfigError) as info:
        _config(tiny_model_dir, tmp_path, f"data.train_files={folder}", "trainer.max_consecutive_nan_steps=0",
                f"trainer.default_local_dir={tmp_path / 'a_file' / 'run'}")
    text = str(info.value)
    assert f"data.train_files: '{folder}' is a folder" in text
    assert "trainer.max_consecutive_nan_steps=0 must be >= 1" in text
    assert f"trainer.default_local_dir='{tmp_path / 'a_file' / 'run'}': {tmp_path / 'a_file'} is a file" in text


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_an_unwritable_default_local_dir(tiny_model_dir, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(ConfigError, match="is not writable"):
        _config(tiny_model_dir, tmp_path, f"trainer.default_local_dir={locked / 'run'}")


def test_a_missing_config_path(capsys):
    from npu_rl.trainer.main_ppo import main

    assert main(["--config-path", "/no/such/folder"]) == 2
    assert "--config-path '/no/such/folder': /no/such/folder is not a folder" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--limit", "-3"], "--limit -3: give a positive number"),
    (["--limit", "0"], "--limit 0: give a positive number"),
    (["--k", "5", "--n", "2"], "--k 5: pass@k needs 1 <= k <= --n (=2)"),
])
def test_eval_arguments_that_would_measure_something_else(argv, message, capsys):
    from npu_rl.commands.evaluate import main

    assert main(["some-model", "--task", "arith", *argv]) == 2
    assert message in capsys.readouterr().err


def test_output_paths_under_a_file_are_refused_before_the_work(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    from npu_rl.data.preprocess import preprocess_main
    from npu_rl.commands.evaluate import main as eval_main
    from npu_rl.commands.merge import main as merge_main

    assert eval_main(["some-model", "--task", "arith", "--out", str(blocker / "results.json")]) == 2
    assert f"{blocker} is a file" in capsys.readouterr().err  # before any model is looked for
    assert merge_main([str(tmp_path), "--out", str(blocker)]) == 2
    assert f"--out='{blocker}': {blocker} is a file, not a folder" in capsys.readouterr().err
    assert preprocess_main(["arith", "--output-dir", str(blocker / "arith")]) == 2
    assert f"{blocker} is a file" in capsys.readouterr().err


def test_truncation_right_and_filtered_prompts_are_counted_and_warned(tmp_path, caplog):
    from npu_rl.data.dataset import PromptDataset
    from tests.helpers import make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    long_row = {"data_source": "arith", "prompt": [{"role": "user", "content": "7 " * 60}],
                "reward_model": {"ground_truth": "1"}}
    data = _rows(tmp_path / "d.jsonl", [_row("2"), long_row])
    with caplog.at_level(logging.WARNING, logger="npu_rl.data.dataset"):
        ds = PromptDataset(data, tok, max_prompt_length=40, truncation="right")
    assert ds.num_truncated == 1
    assert "data.truncation=right cut 1 of 2 prompts" in caplog.text and "assistant header" in caplog.text
    assert f"{data}: row 1" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="npu_rl.data.dataset"):
        ds = PromptDataset(data, tok, max_prompt_length=40, filter_overlong_prompts=True)
    assert ds.num_filtered == 1 and "dropped 1 of 2 prompts" in caplog.text
