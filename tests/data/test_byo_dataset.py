"""docs/byo_dataset.md's walk-through, offline: a Hugging Face DatasetDict of raw GSM8K rows -> the prompt schema
(examples/byo_dataset/prepare_hf_dataset.py) -> a config that validates with the example reward function."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests.conftest import REPO_ROOT

datasets = pytest.importorskip("datasets", reason="pip install datasets")
EXAMPLE = os.path.join(REPO_ROOT, "examples", "byo_dataset")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prepare_then_train_config(tmp_path, packaged_data_dir, capsys):
    from npu_rl.trainer.preflight import load_checked
    from npu_rl.data.io import read_jsonl, read_rows
    from npu_rl.data.preprocess import find_raw_file, gsm8k_answer

    raw_rows = {s: read_jsonl(find_raw_file(packaged_data_dir, "gsm8k", s))[:6] for s in ("train", "test")}
    datasets.DatasetDict({s: datasets.Dataset.from_list(r) for s, r in raw_rows.items()}).save_to_disk(
        str(tmp_path / "raw"))
    out = tmp_path / "prepared"
    assert _load("prepare_hf_dataset").main([
        "--from-disk", str(tmp_path / "raw"), "--question", "question", "--answer", "answer",
        "--answer-regex", "#### (.+)", "--out", str(out)]) == 0
    rows = read_rows(str(out / "train"))
    assert len(rows) == 6 and rows[0]["data_source"] == "my_dataset"
    assert [r["reward_model"]["ground_truth"] for r in rows] == [gsm8k_answer(r["answer"]) for r in raw_rows["train"]]
    assert rows[0]["prompt"][0]["content"].startswith(raw_rows["train"][0]["question"])

    reward = _load("reward")
    truth = rows[0]["reward_model"]["ground_truth"]
    assert reward.compute_score("my_dataset", f"so the answer is \\boxed{{{truth}}}", truth)["score"] == 1.0
    assert reward.compute_score("my_dataset", "I think 12345679", truth)["score"] == 0.0

    config = load_checked([f"data.train_files={out / 'train'}", f"data.val_files={out / 'test'}",
                           f"custom_reward_function.path={os.path.join(EXAMPLE, 'reward.py')}",
                           "custom_reward_function.name=compute_score"], "quickstart")
    assert config.data.train_files == str(out / "train")
