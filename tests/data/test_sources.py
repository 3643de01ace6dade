"""Data paths (npu_rl.data.sources): globs, schemes, the Hub's file and data set forms against a fake Hub on
127.0.0.1 (HF_ENDPOINT), and offline reads from the caches. Nothing reaches the internet."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap

import pytest

from npu_rl.config.loader import quote_query_value
from npu_rl.data.io import read_rows, write_parquet
from npu_rl.data.sources import data_files_problems, resolve_data_files, resolve_data_path
from tests.fake_hub import FakeHub, offline_env, online_env

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
         "reward_model": {"style": "rule", "ground_truth": str(i + 1)}} for i in range(4)]


def _parquet_bytes(rows) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


@pytest.fixture()
def data_hub():
    server = FakeHub().start()
    server.add("datasets", "tiny-org/tiny-set", {
        "README.md": b"---\nlicense: mit\n---\n",
        "data/train-00000-of-00002.parquet": _parquet_bytes(ROWS[:2]),
        "data/train-00001-of-00002.parquet": _parquet_bytes(ROWS[2:]),
        "data/test-00000-of-00001.parquet": _parquet_bytes(ROWS[:1]),
    })
    yield server
    server.stop()


def test_local_globs_and_refused_schemes(tmp_path):
    for i in (1, 0):
        write_parquet(ROWS[2 * i:2 * i + 2], str(tmp_path / f"train-{i}.parquet"))
    paths = resolve_data_files(str(tmp_path / "train-*.parquet"))
    assert paths == [str(tmp_path / "train-0.parquet"), str(tmp_path / "train-1.parquet")]  # sorted
    assert [r for p in paths for r in read_rows(p)] == ROWS
    with pytest.raises(FileNotFoundError, match="the pattern matches no file"):
        resolve_data_path(str(tmp_path / "val-*.parquet"))
    with pytest.raises(ValueError, match="hdfs:// data paths are not read here"):
        resolve_data_path("hdfs://nn/data/train.parquet")
    (problem,) = data_files_problems("train_files", "openai/gsm8k")
    assert "hf://datasets/openai/gsm8k?split=train" in problem


def test_a_split_query_needs_no_quoting_in_an_override():
    assert quote_query_value("data.train_files=hf://datasets/o/n?split=train") == \
        "data.train_files='hf://datasets/o/n?split=train'"
    assert quote_query_value("data.train_files=~/d?split=test") == "data.train_files='~/d?split=test'"
    for unchanged in ("data.train_files='hf://datasets/o/n?split=train'", "data.train_files=[a,b]",
                      "trainer.total_epochs=3", "data.train_files=~/data/train-?.parquet"):
        assert quote_query_value(unchanged) == unchanged


def test_hub_files_download_then_read_offline(data_hub, tmp_path, monkeypatch):
    home = str(tmp_path / "hf")
    online_env(monkeypatch, data_hub, home)
    one = resolve_data_path("hf://datasets/tiny-org/tiny-set/data/test-00000-of-00001.parquet")
    assert read_rows(one[0]) == ROWS[:1]
    assert one[0].startswith(os.path.join(home, "hub", "datasets--tiny-org--tiny-set", "snapshots"))
    both = resolve_data_path("hf://datasets/tiny-org/tiny-set/data/train-*.parquet")
    assert [r for p in both for r in read_rows(p)] == ROWS
    sha = data_hub.sha("datasets", "tiny-org/tiny-set")
    pinned = resolve_data_path(f"hf://datasets/tiny-org/tiny-set@{sha}/data/test-00000-of-00001.parquet")
    assert f"/snapshots/{sha}/" in pinned[0]
    assert data_files_problems("train_files", "hf://datasets/tiny-org/tiny-set/data/nope.parquet")[0].startswith(
        "data.train_files: 'hf://datasets/tiny-org/tiny-set/data/nope.parquet': cannot get it from http://127.0.0.1")
    data_hub.stop()
    offline_env(monkeypatch, home)
    assert resolve_data_path("hf://datasets/tiny-org/tiny-set/data/train-*.parquet") == both
    (problem,) = data_files_problems("val_files", "hf://datasets/tiny-org/other/x.parquet")
    assert "HF_HUB_OFFLINE is set" in problem and os.path.join(home, "hub") in problem


_THROUGH_DATASETS = textwrap.dedent("""\
    import json, os, sys
    from npu_rl.data.sources import data_files_problems, resolve_data_files
    from npu_rl.data.io import read_rows
    out = []
    for uri in sys.argv[1:]:
        problems = data_files_problems("train_files", uri)
        rows = [] if problems else [r for p in resolve_data_files(uri) for r in read_rows(p)]
        out.append({"problems": problems, "rows": rows})
    print(json.dumps(out), flush=True)
    os._exit(0)  # read and printed: the interpreter's teardown of datasets and pyarrow checks nothing
    """)


def _in_process(env_extra: dict, *uris: str) -> list[dict]:
    """huggingface_hub and datasets read HF_HUB_OFFLINE / HF_ENDPOINT / HF_HOME once, at import: a fresh
    interpreter sees the environment as a user's run would. The URIs are read one after the other in that one
    interpreter (importing datasets costs seconds): one result each."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_OFFLINE"))}
    env.update(env_extra, PYTHONPATH=REPO_ROOT)
    out = subprocess.run([sys.executable, "-c", _THROUGH_DATASETS, *uris], env=env, capture_output=True, text=True,
                         timeout=240, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_hub_data_sets_through_datasets_online_then_from_its_cache_offline(data_hub, tmp_path):
    home = str(tmp_path / "hf")
    online = {"HF_HOME": home, "HF_ENDPOINT": data_hub.endpoint, "HF_HUB_OFFLINE": "0",
              "NPU_RL_CACHE": str(tmp_path / "npu_rl_a")}
    (got,) = _in_process(online, "hf://datasets/tiny-org/tiny-set?split=train")
    assert got["problems"] == [] and got["rows"] == ROWS
    data_hub.stop()
    # offline, with our own parquet cache empty: datasets' cache (under HF_HOME) still has the set, not the other
    offline = {"HF_HOME": home, "HF_HUB_OFFLINE": "1", "NPU_RL_CACHE": str(tmp_path / "npu_rl_b")}
    got, never = _in_process(offline, "hf://datasets/tiny-org/tiny-set?split=train",
                             "hf://datasets/tiny-org/never-loaded?split=train")
    assert got["problems"] == [] and got["rows"] == ROWS
    (problem,) = never["problems"]
    assert "never-loaded" in problem and "HF_HUB_OFFLINE is set and datasets' cache has no copy" in problem
