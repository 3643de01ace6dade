"""The generated arithmetic task and ``builtin://`` paths (generated once, cached under $NPU_RL_CACHE)."""

from __future__ import annotations

import os

import pytest

from npu_rl.data.arith import ArithSpec, generate_arith
from npu_rl.data.builtin import cache_dir, check_builtin, resolve_builtin, resolve_data_files
from npu_rl.data.io import read_rows


def _expressions(rows):
    return [r["extra_info"]["expression"] for r in rows]


def test_default_is_held_out_one_digit_addition():
    splits = generate_arith()
    train, test = splits["train"], splits["test"]
    # 10 x 10 distinct problems: a quarter held out, the rest for training, none shared
    assert (len(train), len(test)) == (75, 25)
    assert not set(_expressions(train)) & set(_expressions(test))
    assert len(set(_expressions(train) + _expressions(test))) == 100
    for row in train + test:
        a, op, b = row["extra_info"]["expression"].split()
        assert op == "+" and 0 <= int(a) <= 9 and 0 <= int(b) <= 9
        assert row["reward_model"]["ground_truth"] == str(int(a) + int(b))
        assert row["prompt"] == [{"role": "user", "content": f"What is {a} + {b}? Give only the answer."}]
    assert generate_arith() == splits  # deterministic
    assert generate_arith(ArithSpec(seed=1))["test"] != test  # the seed picks the held-out problems


def test_configurable_operators_digits_and_sampled_spaces():
    spec = ArithSpec(num_operands=3, operators="+-*", min_digits=2, max_digits=3, num_train=300, num_test=40, seed=7)
    splits = generate_arith(spec)
    assert (len(splits["train"]), len(splits["test"])) == (300, 40)
    assert not set(_expressions(splits["train"])) & set(_expressions(splits["test"]))
    for row in splits["train"]:
        tokens = row["extra_info"]["expression"].split()
        operands, operators = tokens[::2], tokens[1::2]
        assert len(operands) == 3 and all(10 <= int(x) <= 999 for x in operands)
        assert set(operators) <= {"+", "-", "*"}
        assert int(row["reward_model"]["ground_truth"]) == eval(row["extra_info"]["expression"])  # precedence
    assert generate_arith(spec) == splits


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_operands=1), "num_operands"),
    (dict(operators="/"), "operators"),
    (dict(min_digits=2, max_digits=1), "min_digits"),
    (dict(num_test=0), "num_test"),
])
def test_bad_specs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ArithSpec(**kwargs)


def test_builtin_paths_are_generated_once_and_cached():
    train = resolve_builtin("builtin://arith/train")
    test = resolve_builtin("builtin://arith/test")
    assert train.startswith(os.path.join(cache_dir(), "datasets", "arith-"))
    assert os.path.dirname(train) == os.path.dirname(test)
    assert read_rows(train) == generate_arith()["train"]
    mtime = os.path.getmtime(train)
    assert resolve_builtin("builtin://arith/train") == train and os.path.getmtime(train) == mtime
    # parameters give another cache entry; '+' survives the query string
    other = resolve_builtin("builtin://arith/test?digits=2&operators=+-&seed=4")
    assert os.path.dirname(other) != os.path.dirname(test)
    assert {r["extra_info"]["expression"].split()[1] for r in read_rows(other)} == {"+", "-"}


@pytest.mark.parametrize("uri, message", [
    ("builtin://mnist/train", "unknown built-in data set"),
    ("builtin://arith/validation", "has splits"),
    ("builtin://arith/train?digit=2", "unknown arith parameter 'digit'"),
    ("builtin://arith/train?seed=x", "not an integer"),
    ("builtin://gsm8k/train?seed=1", "no parameters other than data_dir"),
    ("builtin://arith/train?num_train=1000000000", "num_train and num_test must be <= 1,000,000"),
    ("builtin://arith_tool/train?num_test=99999999", "num_train and num_test must be <= 1,000,000"),
    ("builtin://arith/train?num_operands=1000", r"num_operands must be in \[2, 16\]"),
])
def test_bad_builtin_paths(uri, message):
    with pytest.raises(ValueError, match=message):
        check_builtin(uri)  # what the config validator calls: checks without generating
    with pytest.raises(ValueError, match=message):
        resolve_builtin(uri)


def test_check_builtin_generates_nothing(tmp_path):
    check_builtin("builtin://arith/train?digits=2")
    assert not os.path.exists(cache_dir())
    with pytest.raises(FileNotFoundError, match="raw file .*gsm8k/train.jsonl .*does not exist"):
        check_builtin(f"builtin://gsm8k/train?data_dir={tmp_path}")


def test_builtin_local_data_sets(packaged_data_dir):
    path = resolve_builtin(f"builtin://aime24/test?data_dir={packaged_data_dir}")
    rows = read_rows(path)
    assert len(rows) == 30 and rows[0]["data_source"] == "aime2024"


def test_resolve_data_files(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "a.jsonl").write_text("{}\n")
    paths = resolve_data_files(["~/a.jsonl", "builtin://arith/test"])
    assert paths[0] == str(tmp_path / "a.jsonl") and paths[1].endswith("test.parquet")
    assert resolve_data_files("~/a.jsonl") == [str(tmp_path / "a.jsonl")]
    with pytest.raises(FileNotFoundError, match="'~/missing.parquet' does not exist"):
        resolve_data_files(["~/a.jsonl", "~/missing.parquet"])
    with pytest.raises(ValueError, match="empty list"):
        resolve_data_files([])
    with pytest.raises(TypeError, match="expected a path string"):
        resolve_data_files([3])
