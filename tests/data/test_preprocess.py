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


def test_gsm8k_to_verl_schema(packaged_data_dir, tmp_path, capsys):
    assert preprocess_main(["gsm8k", "--data-dir", packaged_data_dir, "--output-dir", str(tmp_path)]) == 0
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


def test_math500_and_aime24(packaged_data_dir):
    math500 = convert("math500", packaged_data_dir)["test"]
    assert len(math500) == 500 and set(math500[0]) == SCHEMA
    assert math500[0]["data_source"] == "HuggingFaceH4/MATH-500"
    assert math500[0]["prompt"][0]["content"].endswith(" " + BOXED_INSTRUCTION)
    assert math500[0]["reward_model"]["ground_truth"] == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert math500[0]["extra_info"]["level"] == 2
    aime = convert("aime24", packaged_data_dir)["test"]
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


def test_default_data_dir_is_the_packaged_copy(monkeypatch):
    monkeypatch.delenv("NPU_RL_DATA_DIR", raising=False)
    repo_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert default_data_dir() == os.path.join(repo_root, "npu_rl", "data", "sets")


def test_packaged_data_sets_are_the_documented_bytes_with_their_licences(packaged_data_dir):
    """The sha256 prefixes and suffixes in sets/README.md are those of the decompressed files; every set names its
    licence; the package data glob in pyproject.toml ships them."""
    import hashlib
    import lzma
    import re
    import tomllib

    with open(os.path.join(packaged_data_dir, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    expected = {"gsm8k/train": 7473, "gsm8k/test": 1319, "math500/test": 500, "aime24/test": 30}
    for name, rows in expected.items():
        path = os.path.join(packaged_data_dir, name + ".jsonl.xz")
        with lzma.open(path, "rb") as f:
            data = f.read()
        digest = hashlib.sha256(data).hexdigest()
        assert re.search(f"{digest[:8]}…{digest[-4:]}", readme), (name, digest)
        assert data.count(b"\n") == rows
        assert os.path.getsize(path) < 1_000_000
    for folder, notice in (("gsm8k", "LICENSE"), ("math500", "LICENSE"), ("aime24", "NOTICE")):
        assert os.path.getsize(os.path.join(packaged_data_dir, folder, notice)) > 200
    with open(os.path.join(repo_root_of(packaged_data_dir), "pyproject.toml"), "rb") as f:
        globs = tomllib.load(f)["tool"]["setuptools"]["package-data"]["npu_rl.data"]
    assert "sets/*/*.jsonl.xz" in globs and "sets/*/LICENSE" in globs and "sets/*/NOTICE" in globs


def repo_root_of(data_dir: str) -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(data_dir)))


def test_nothing_reads_data_from_outside_the_repository():
    """No module, test or script reaches for a folder beside the clone (the old ../shared/data)."""
    repo_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    offenders = []
    for top in ("npu_rl", "tests", "scripts"):
        for root, _, files in os.walk(os.path.join(repo_root, top)):
            for name in files:
                if name.endswith((".py", ".sh", ".yaml")) and name != os.path.basename(__file__):
                    with open(os.path.join(root, name), encoding="utf-8") as f:
                        text = f.read()
                    if "shared/data" in text or "../shared" in text:
                        offenders.append(os.path.join(root, name))
    assert not offenders


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


def test_a_datasets_save_to_disk_folder_is_a_data_file(tmp_path, tiny_tokenizer):
    """data.train_files may name a folder written by datasets' save_to_disk (load_from_disk), or a DatasetDict root
    (its split named with ?split=, else train / validation-or-test by key); a plain folder is refused with the fix."""
    datasets = pytest.importorskip("datasets", reason="the datasets package is not installed")
    from npu_rl.data.io import read_rows
    from npu_rl.data.sources import data_files_problems, resolve_data_files

    rows = convert("aime24")["test"][:3]
    ds = datasets.Dataset.from_list(rows)
    ds.save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dict"))
    assert data_files_problems("train_files", str(tmp_path / "one")) == []
    assert resolve_data_files(str(tmp_path / "one")) == [str(tmp_path / "one")]
    back = read_rows(str(tmp_path / "one"))
    assert back == rows
    with pytest.raises(ValueError, match="DatasetDict with splits .*train.*give one split"):
        read_rows(str(tmp_path / "dict"))
    assert read_rows(str(tmp_path / "dict" / "test")) == rows
    root = str(tmp_path / "dict")
    assert resolve_data_files(root, "train") == [os.path.join(root, "train")]
    assert resolve_data_files(root, "validation") == [os.path.join(root, "test")]  # no 'validation': then 'test'
    assert resolve_data_files(root + "?split=test", "train") == [os.path.join(root, "test")]
    assert data_files_problems("val_files", [root]) == []
    (problem,) = data_files_problems("train_files", root + "?split=dev")
    assert "has splits ['train', 'test'], not split 'dev'" in problem and "?split=train" in problem
    (tmp_path / "plain").mkdir()
    (problem,) = data_files_problems("train_files", str(tmp_path / "plain"))
    assert "not one written by datasets' save_to_disk" in problem and "*.parquet" in problem


def test_hub_data_sets_are_refused_offline_before_any_download(tmp_path, monkeypatch):
    from npu_rl.data.sources import resolve_data_path as resolve_hub

    monkeypatch.setenv("NPU_RL_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE is set"):
        resolve_hub("hf://datasets/openai/gsm8k/main?split=train")
    with pytest.raises(ValueError, match="expected hf://datasets/<owner>/<name>"):
        resolve_hub("hf://datasets/gsm8k?split=train")
    with pytest.raises(ValueError, match="name a split .*or a file in the repo"):
        resolve_hub("hf://datasets/openai/gsm8k/main")
    with pytest.raises(ValueError, match="only data set repos"):
        resolve_hub("hf://openai/gsm8k/main/train.parquet")


def test_compressed_jsonl_is_read_and_a_damaged_one_named(tmp_path):
    import gzip

    from npu_rl.data.io import read_rows

    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(b'{"x": 1}\n{"x": 2}\n'))
    assert read_rows(str(tmp_path / "a.jsonl.gz")) == [{"x": 1}, {"x": 2}]
    (tmp_path / "b.jsonl.xz").write_bytes(b"not xz")
    with pytest.raises(ValueError, match="b.jsonl.xz: cannot decompress"):
        read_rows(str(tmp_path / "b.jsonl.xz"))


def test_geo3k_from_a_local_copy_is_verls_schema(tmp_path):
    """A local copy of hiyouga/geometry3k (its data/<split>-*.parquet layout) -> verl's geo3k rows, images kept."""
    from PIL import Image

    from npu_rl.data.images import image_bytes, row_image_problem
    from npu_rl.data.io import read_rows, write_parquet
    from npu_rl.data.preprocess import GEO3K_INSTRUCTION, preprocess_main

    png = image_bytes(Image.new("RGB", (40, 30), (9, 9, 9)))
    raw = tmp_path / "geometry3k"
    for split, answer in (("train", "3"), ("test", "\\frac{1}{2}")):
        write_parquet([{"images": [{"bytes": png, "path": "a.png"}], "problem": "<image>Find x.", "answer": answer}],
                      str(raw / "data" / f"{split}-00000-of-00001.parquet"))
    out = tmp_path / "out"
    assert preprocess_main(["geo3k", "--data-dir", str(raw), "--output-dir", str(out)]) == 0
    train = read_rows(str(out / "train.parquet"))
    assert train[0]["prompt"] == [{"role": "user", "content": "<image>Find x. " + GEO3K_INSTRUCTION}]
    assert train[0]["data_source"] == "hiyouga/geometry3k" and train[0]["reward_model"]["ground_truth"] == "3"
    assert train[0]["images"][0]["bytes"] == png
    assert row_image_problem(train[0], "prompt", "images", str(out)) is None
    assert read_rows(str(out / "test.parquet"))[0]["reward_model"]["ground_truth"] == "\\frac{1}{2}"
    assert GEO3K_INSTRUCTION.endswith("MUST BE put in \\boxed{}.")
    assert preprocess_main(["geo3k", "--output-dir", str(tmp_path / "o2")]) == 2  # no local copy named: refused
