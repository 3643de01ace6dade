"""`npu-rl eval`, `npu-rl merge`, `npu-rl train --cfg job` and the CLI's routing."""

from __future__ import annotations

import json
import os

import pytest

from npu_rl.cli import main as cli
from npu_rl.commands.evaluate import pass_at_k
from tests.trainer.conftest import base_overrides, run_training


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 1, 0.4),  # 2 of 5 correct: one draw succeeds with p = 2/5
    (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (5, 0, 3, 0.0),
    (4, 3, 2, 1.0),  # fewer than k wrong samples: a draw of 2 always holds a correct one
])
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_eval_on_the_arith_task(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "eval.json"
    code = cli(["eval", tiny_model_dir, "--task", "arith", "--limit", "6", "--engine", "hf", "--max-new-tokens", "4",
                "--n", "2", "--batch-size", "4", "--out", str(out)])
    assert code == 0
    results = json.loads(out.read_text())
    assert results["num_problems"] == 6 and results["n"] == 2 and results["temperature"] == 1.0
    assert 0.0 <= results["accuracy"] <= results["pass@2"] <= 1.0
    printed = capsys.readouterr()
    assert json.loads(printed.out)["task"] == "arith"  # stdout is one JSON document; the samples go to stderr
    assert len(results["samples"]) == 3 and "--- sample 1 (score" in printed.err  # --samples 3 by default


def test_eval_gsm8k_scores_strict_and_flexible_and_shows_samples(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert cli(["eval", tiny_model_dir, "--task", "gsm8k", "--limit", "4", "--engine", "hf", "--max-new-tokens", "3",
                "--batch-size", "4", "--samples", "2", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["accuracy_strict"] == results["accuracy"]
    assert 0.0 <= results["accuracy_flexible"] <= 1.0
    assert [set(s) for s in results["samples"]] == [{"prompt_tail", "response", "ground_truth", "score",
                                                     "flexible"}] * 2
    for sample in results["samples"]:  # the prompt part only (an H200 run showed the response there too)
        assert sample["response"] == "" or not sample["prompt_tail"].endswith(sample["response"])
    printed = capsys.readouterr().err
    assert printed.count("--- sample ") == 2 and ">>> " + results["samples"][0]["response"] in printed


def test_eval_and_merge_take_a_checkpoint(tiny_model_dir, tmp_path, reward_file):
    run_dir = str(tmp_path / "run")
    assert run_training(base_overrides(tiny_model_dir, run_dir, reward_file) + [
        "preset=grpo", "trainer.total_training_steps=1", "trainer.val_before_train=False", "trainer.save_freq=1"]) == 0
    merged = str(tmp_path / "merged")
    assert cli(["merge", run_dir, "--out", merged]) == 0  # the run folder: its latest step is taken
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(merged).config.num_hidden_layers == 2
    assert os.path.isfile(os.path.join(merged, "tokenizer.json"))
    assert cli(["eval", os.path.join(run_dir, "global_step_1"), "--task", "arith", "--limit", "2", "--engine", "hf",
                "--max-new-tokens", "2"]) == 0


def test_merge_names_what_is_wrong(tmp_path, capsys):
    assert cli(["merge", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "is not a checkpoint" in capsys.readouterr().err


def test_cfg_job_prints_and_validates_the_quickstart(capsys):
    assert cli(["train", "--cfg", "job"]) == 0
    out = capsys.readouterr()
    assert "path: smollm2-135m-instruct" in out.out and "adv_estimator: grpo" in out.out
    assert "config 'quickstart' is valid" in out.err


def test_train_with_a_misspelt_key_suggests_the_right_one(capsys):
    assert cli(["train", "actor_rollout_ref.actor.optim.lrr=1e-6"]) == 2
    assert "did you mean 'actor_rollout_ref.actor.optim.lr'" in capsys.readouterr().err


def test_device_npu_here_fails_clearly(monkeypatch, capsys):
    monkeypatch.setenv("DEVICE", "npu")
    assert cli(["train", "--cfg", "job"]) == 2
    err = capsys.readouterr().err
    assert "DEVICE=npu was requested but torch_npu is not importable" in err and "pip install torch-npu" in err


def test_unknown_command_suggests(capsys):
    assert cli(["trian"]) == 2
    assert "did you mean 'train'" in capsys.readouterr().err
