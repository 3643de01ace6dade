"""``npu-rl preprocess``: the shared JSONL -> verl's parquet schema, and the errors for missing or bad input."""

from __future__ import annotations

import json
import os

import pandas as pd
import pyarrow.parquet as pq
import pytest

from npu_rl.data.io import read_rows
from npu_rl.data.preprocess import (
    BOXED_INSTRUCTION,
    GSM8K_INSTRUCTION,
    convert,
    default_data_dir,
    gsm8k_answer,
    preprocess_main,
)

SCHEMA = {"data_source", "prompt", "ability", "reward_model", "extra_info"}


def test_gsm8k_to_verl_schema(shared_data_dir, tmp_path, capsys):
    assert preprocess_main(["gsm8k", "--data-dir", shared_data_dir, "--output-dir", str(tmp_path)]) == 0
    assert "gsm8k train: 7473 rows" in capsys.readouterr().out
    train, test = read_rows(str(tmp_path / "train.parquet")), read_rows(str(tmp_path / "test.parquet"))
    assert (len(train), len(test)) == (7473, 1319)
    row = test[0]
    assert set(row) == SCHEMA
    assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
    assert row["prompt"] == [{"role": "user", "content": row["extra_info"]["question"] + " " + GSM8K_INSTRUCTION}]
    assert GSM8K_INSTRUCTION == 'Let\'s think step by step and output the final answer after "####".'
    assert row["reward_model"] == {"style": "rule", "ground_truth": "18"}  # Janet's ducks
    assert row["extra_info"]["split"] == "test" and row["extra_info"]["index"] == 0
    assert row["extra_info"]["answer"].endswith("#### 18")
    # pandas (what verl reads with) sees the same rows; the prompt column holds the chat messages
    frame = pd.read_parquet(tmp_path / "test.parquet")
    assert list(frame.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert frame.iloc[5]["prompt"][0]["role"] == "user"
    assert pq.read_schema(tmp_path / "train.parquet").field("reward_model").type.num_fields == 2


def test_gsm8k_ground_truth_drops_thousands_separators():
    assert gsm8k_answer("so 1,200 + 34 = 1,234\n#### 1,234") == "1234"
    with pytest.raises(ValueError, match="no '#### <number>'"):
        gsm8k_answer("the answer is 5")


def test_math500_and_aime24(shared_data_dir):
    math500 = convert("math500", shared_data_dir)["test"]
    assert len(math500) == 500 and set(math500[0]) == SCHEMA
    assert math500[0]["data_source"] == "HuggingFaceH4/MATH-500"
    assert math500[0]["prompt"][0]["content"].endswith(" " + BOXED_INSTRUCTION)
    assert math500[0]["reward_model"]["ground_truth"] == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert math500[0]["extra_info"]["level"] == 2
    aime = convert("aime24", shared_data_dir)["test"]
    assert len(aime) == 30 and {r["data_source"] for r in aime} == {"aime2024"}
    by_id = {r["extra_info"]["id"]: r["reward_model"]["ground_truth"] for r in aime}
    assert by_id[60] == "204" and by_id[67] == "25"  # "025" in the source: AIME answers are integers 0-999


def test_arith_cli(tmp_path):
    out = tmp_path / "arith"
    assert preprocess_main(["arith", "--output-dir", str(out), "--max-digits", "2", "--operators", "+-",
                            "--num-train", "50", "--num-test", "10", "--seed", "3"]) == 0
    train, test = read_rows(str(out / "train.parquet")), read_rows(str(out / "test.parquet"))
    assert (len(train), len(test)) == (50, 10)
    assert {r["data_source"] for r in train} == {"arith"}


def test_missing_data_dir_is_a_clear_error_not_a_download(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert preprocess_main(["gsm8k", "--data-dir", str(missing), "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(missing / "gsm8k" / "train.jsonl") in err and "never downloads" in err
    assert not (tmp_path / "o").exists()


def test_data_dir_from_environment(tmp_path, monkeypatch):
    (tmp_path / "gsm8k").mkdir()
    for split in ("train", "test"):
        (tmp_path / "gsm8k" / f"{split}.jsonl").write_text(
            json.dumps({"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}) + "\n")
    monkeypatch.setenv("NPU_RL_DATA_DIR", str(tmp_path))
    assert default_data_dir() == str(tmp_path)
    rows = convert("gsm8k")
    assert rows["train"][0]["reward_model"]["ground_truth"] == "2"


def test_default_data_dir_is_shared_data_next_to_the_repo(monkeypatch):
    monkeypatch.delenv("NPU_RL_DATA_DIR", raising=False)
    repo_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert default_data_dir() == os.path.normpath(os.path.join(repo_root, "..", "shared", "data"))


def test_bad_raw_rows_name_the_file_and_row(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    path = tmp_path / "gsm8k" / "train.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "a\n#### 1"}) + "\n"
                    + json.dumps({"question": "q2", "answer": "no marker"}) + "\n")
    (tmp_path / "gsm8k" / "test.jsonl").write_text(json.dumps({"answer": "#### 3"}) + "\n")
    with pytest.raises(ValueError, match=rf"{path}: row 1: no '#### <number>'"):
        convert("gsm8k", str(tmp_path))
    path.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n")
    with pytest.raises(ValueError, match=r"test.jsonl: row 0 has no 'question'"):
        convert("gsm8k", str(tmp_path))


def test_unknown_dataset():
    with pytest.raises(SystemExit):
        preprocess_main(["imagenet"])
    with pytest.raises(ValueError, match="known: aime24, gsm8k, math500, arith"):
        convert("imagenet")
