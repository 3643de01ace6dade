"""ModelScope data sets in data.train_files / val_files (npu_rl.data.modelscope_sets) against a fake ModelScope server
on 127.0.0.1 (tests/fake_modelscope.py, serving a data set repo's paged listing and files as modelscope 1.40
requests them) and the cache it fills; nothing reaches the internet."""

from __future__ import annotations

import io
import os
import threading

import pytest

from npu_rl.api import _data_path
from npu_rl.config.loader import load_config
from npu_rl.data.io import read_rows
from npu_rl.data.modelscope_sets import ModelScopeData, parse_modelscope_data
from npu_rl.data.sources import data_files_problems, resolve_data_files, resolve_data_path
from npu_rl.trainer.checks.files import file_problems
from tests.fake_modelscope import FakeModelScope
from tests.models.test_modelscope_hub import SMALL, ms_env, needs_modelscope

SET = "tiny-org/tiny-set"
ROWS = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
         "reward_model": {"style": "rule", "ground_truth": str(i + 1)}} for i in range(6)]
CARD = b"""---
license: mit
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*.parquet
  - split: test
    path: main/test-*.parquet
---
"""


def _parquet(rows) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def _jsonl(rows) -> bytes:
    import json

    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture()
def fake_sets():
    server = FakeModelScope().start()
    server.add_dataset(SET, {
        "README.md": CARD,
        "main/train-00000-of-00002.parquet": _parquet(ROWS[:2]),
        "main/train-00001-of-00002.parquet": _parquet(ROWS[2:4]),
        "main/test-00000-of-00001.parquet": _parquet(ROWS[4:]),
        "raw/test.jsonl": _jsonl(ROWS[4:]),
        "loader.py": b"raise SystemExit('a loading script must never be fetched or run')",
    }, revisions=("v1",))
    server.add_dataset("tiny-org/flat", {"train.parquet": _parquet(ROWS[:3]), "test.parquet": _parquet(ROWS[3:])})
    yield server
    server.stop()


def _rows(paths: list[str]) -> list[dict]:
    return [r for p in paths for r in read_rows(p)]


def test_entries_explicit_and_under_verls_switch(tmp_path, monkeypatch):
    monkeypatch.delenv("VERL_USE_MODELSCOPE", raising=False)
    assert parse_modelscope_data("modelscope://o/n/data/train.parquet") == ModelScopeData(
        "o/n", None, "data/train.parquet", None, "modelscope://o/n/data/train.parquet", True)
    assert parse_modelscope_data("modelscope://o/n@v1/d/*.parquet").revision == "v1"
    split = parse_modelscope_data("modelscope://o/n/main?split=test&revision=v2")
    assert (split.repo_id, split.path, split.split, split.revision) == ("o/n", "main", "test", "v2")
    assert parse_modelscope_data("o/n/train.parquet") is None  # a relative path without the switch
    for bad, why in [("modelscope://gsm8k", "no <owner>/<name>"), ("modelscope://o/n/../../etc/x.parquet", "path"),
                     ("modelscope://o/n", "name a split"), ("modelscope://o/n/a/b?split=train", "neither a parquet"),
                     ("modelscope://o/n@bad rev/x.parquet", "revision")]:
        with pytest.raises(ValueError, match=why):
            parse_modelscope_data(bad)
    with pytest.raises(ValueError, match="takes no \\?split="):
        parse_modelscope_data("modelscope://o/n/x.parquet?split=train")
    monkeypatch.setenv("VERL_USE_MODELSCOPE", "True")
    assert parse_modelscope_data("o/n@v1/x.jsonl") == ModelScopeData("o/n", "v1", "x.jsonl", None, "o/n@v1/x.jsonl",
                                                                     False)
    assert parse_modelscope_data("o/n?split=train").split == "train"
    for not_ours in ("o/n", "/abs/o/n.parquet", "~/d/x.parquet", "./o/n.parquet", "hf://datasets/o/n/x.parquet"):
        assert parse_modelscope_data(not_ours) is None, not_ours
    # a local file of that name wins over the switch
    (tmp_path / "o" / "n").mkdir(parents=True)
    (tmp_path / "o" / "n" / "x.jsonl").write_bytes(_jsonl(ROWS[:1]))
    monkeypatch.chdir(tmp_path)
    assert resolve_data_path("o/n/x.jsonl") == [str(tmp_path / "o" / "n" / "x.jsonl")]
    # the Python API takes a plain id as a data path under the switch, not as a prompt
    assert _data_path(["o/n/data.parquet", "o/n?split=test"], str(tmp_path), "t") == ["o/n/data.parquet",
                                                                                        "o/n?split=test"]


@needs_modelscope
def test_files_download_once_at_validation_then_read_offline(fake_sets, tmp_path, monkeypatch):
    cache = ms_env(monkeypatch, tmp_path, fake_sets.endpoint)
    entry = f"modelscope://{SET}/raw/test.jsonl"
    config = load_config(SMALL[:-2] + [f"data.train_files=modelscope://{SET}/main/train-*.parquet",
                                       f"data.val_files={entry}"])
    assert [p for p in file_problems(config, use_critic=False) if p.startswith("data.")] == []
    snapshot = os.path.join(cache, "datasets", "tiny-org--tiny-set", "snapshots", "master")
    assert os.path.isfile(os.path.join(snapshot, "raw", "test.jsonl"))
    assert not os.path.exists(os.path.join(snapshot, "loader.py"))  # only what the entry names
    fake_sets.requests.clear()
    assert resolve_data_files(entry) == [os.path.join(snapshot, "raw", "test.jsonl")]
    assert fake_sets.requests == []  # a cached file: the server is not asked
    train = resolve_data_files(f"modelscope://{SET}/main/train-*.parquet")  # a glob asks for the listing ...
    assert _rows(train) == ROWS[:4]
    assert fake_sets.requests and not any("FilePath=" in r for r in fake_sets.requests)  # ... downloads nothing new
    got = []  # three ranks of a node at once, nothing cached yet: one download
    threads = [threading.Thread(target=lambda: got.append(resolve_data_files(f"modelscope://{SET}@v1/raw/test.jsonl")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pinned = os.path.join(cache, "datasets", "tiny-org--tiny-set", "snapshots", "v1", "raw", "test.jsonl")
    assert got == [[pinned]] * 3 and read_rows(pinned) == ROWS[4:]
    assert len([r for r in fake_sets.requests if "Revision=v1&FilePath=raw" in r]) == 1
    # ours and modelscope's listing, for the one download; the two ranks that waited on the lock then read the cache
    assert len([r for r in fake_sets.requests if "Revision=v1" in r and "/repo/tree" in r]) == 2
    (problem,) = data_files_problems("train_files", f"modelscope://{SET}/main/nope.parquet")
    assert problem.startswith(f"data.train_files: 'modelscope://{SET}/main/nope.parquet': there is no file "
                              f"main/nope.parquet in the data set repo {SET} on {fake_sets.endpoint}")
    (problem,) = data_files_problems("train_files", "modelscope://tiny-org/no-such-set/x.parquet")
    assert "has no such data set repo as tiny-org/no-such-set" in problem

    fake_sets.stop()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_data_files(f"modelscope://{SET}/main/train-*.parquet") == train
    assert resolve_data_files(entry) == [os.path.join(snapshot, "raw", "test.jsonl")]
    (problem,) = data_files_problems("val_files", f"modelscope://{SET}/main/other.parquet")
    assert problem == (
        f"data.val_files: 'modelscope://{SET}/main/other.parquet': no file main/other.parquet in the ModelScope cache "
        f"({cache}), and HF_HUB_OFFLINE is set. Download it once online (`modelscope download --repo-type dataset "
        f"{SET} --include 'main/other.parquet'`, or unset HF_HUB_OFFLINE), point MODELSCOPE_CACHE at the cache that "
        "has it, or give a local file")
    (problem,) = data_files_problems("val_files", "modelscope://tiny-org/never/*.parquet")
    assert "no file matching the pattern in the ModelScope cache" in problem and cache in problem


@needs_modelscope
def test_a_split_through_datasets_with_the_cards_subsets(fake_sets, tmp_path, monkeypatch):
    ms_env(monkeypatch, tmp_path, fake_sets.endpoint)
    monkeypatch.setenv("NPU_RL_CACHE", str(tmp_path / "npu_rl"))
    (train,) = resolve_data_files(f"modelscope://{SET}/main?split=train")
    assert train.startswith(str(tmp_path / "npu_rl" / "modelscope")) and read_rows(train) == ROWS[:4]
    assert not [n for n in os.listdir(os.path.dirname(train)) if n.startswith(".arrow-")]  # datasets' copy gone
    assert not any("loader.py" in r for r in fake_sets.requests)  # never fetched
    (flat,) = resolve_data_files("modelscope://tiny-org/flat?split=test")  # no card: datasets' file-name rules
    assert read_rows(flat) == ROWS[3:]
    (problem,) = data_files_problems("val_files", f"modelscope://{SET}/main?split=validation")
    assert "datasets.load_dataset(" in problem and "validation" in problem
    fake_sets.stop()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_data_files(f"modelscope://{SET}/main?split=train") == [train]  # our parquet
    monkeypatch.setenv("NPU_RL_CACHE", str(tmp_path / "npu_rl_empty"))
    (test,) = resolve_data_files(f"modelscope://{SET}/main?split=test")  # offline, from ModelScope's cache
    assert read_rows(test) == ROWS[4:]
    (problem,) = data_files_problems("train_files", "modelscope://tiny-org/never?split=train")
    assert "no data file of the set in the ModelScope cache" in problem and "HF_HUB_OFFLINE is set" in problem


@needs_modelscope
def test_verls_switch_sends_a_plain_entry_to_modelscope(fake_sets, tmp_path, monkeypatch):
    ms_env(monkeypatch, tmp_path, fake_sets.endpoint)
    monkeypatch.setenv("NPU_RL_CACHE", str(tmp_path / "npu_rl"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERL_USE_MODELSCOPE", "True")
    assert _rows(resolve_data_files("tiny-org/flat/train.parquet")) == ROWS[:3]
    assert _rows(resolve_data_files("tiny-org/flat?split=test")) == ROWS[3:]
    (problem,) = data_files_problems("train_files", "tiny-org/flat/nope.parquet")
    assert "no local file has that name and VERL_USE_MODELSCOPE is set: a ModelScope data set" in problem
    monkeypatch.setenv("VERL_USE_MODELSCOPE", "False")
    (problem,) = data_files_problems("train_files", "tiny-org/flat?split=test")
    assert "does not exist" in problem  # a local path again


@needs_modelscope
def test_a_repo_without_data_files_is_refused_in_words(tmp_path, monkeypatch):
    server = FakeModelScope().start()
    try:
        server.add_dataset("tiny-org/oss-only", {"README.md": b"# stored in MsDataset's OSS", "ds.py": b"x"})
        ms_env(monkeypatch, tmp_path, server.endpoint)
        monkeypatch.setenv("NPU_RL_CACHE", str(tmp_path / "npu_rl"))
        (problem,) = data_files_problems("train_files", "modelscope://tiny-org/oss-only?split=train")
        assert "holds no data files" in problem and "MsDataset" in problem
    finally:
        server.stop()


def test_without_the_package_an_entry_fails_naming_it(tmp_path, monkeypatch):
    import importlib.util

    ms_env(monkeypatch, tmp_path, offline=True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "modelscope" else real(name, *a))
    (problem,) = data_files_problems("train_files", f"modelscope://{SET}/raw/test.jsonl")
    assert problem == (f"data.train_files: 'modelscope://{SET}/raw/test.jsonl' is a ModelScope data set, and the "
                       "modelscope package is not installed: pip install modelscope (or npu-rl[modelscope])")
    config = load_config(SMALL[:-2] + [f"data.train_files=modelscope://{SET}/raw/test.jsonl",
                                       "data.val_files=builtin://arith/test"])
    assert [p for p in file_problems(config, use_critic=False) if p.startswith("data.")] == [problem]  # once
