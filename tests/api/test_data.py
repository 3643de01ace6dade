"""The Python API's data arguments (``npu_rl.api``), before anything loads (issue 39): a pandas DataFrame is read as
rows, not as its column names; a list of strings that are not paths is refused in words (it is read as data files).
Reward callables: tests/api/test_reward_funcs.py."""

from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq
import pytest

from npu_rl.api import _data_path


def test_a_dataframe_is_read_as_rows(tmp_path):
    frame = pd.DataFrame({"prompt": ["1+1?", "2+2?"], "ground_truth": ["2", "4"]})
    path = _data_path(frame, str(tmp_path), "train_dataset")
    rows = pq.read_table(path).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["2", "4"] and rows[1]["prompt"] == "2+2?"


def test_a_list_of_prompt_strings_is_refused_in_words(tmp_path):
    with pytest.raises(TypeError, match=r"train_dataset: 'What is 2\+2\?' is neither a file nor a data set path"):
        _data_path(["What is 2+2?", "And 3+3?"], str(tmp_path), "train_dataset")
    data = tmp_path / "train.parquet"
    data.write_bytes(b"")
    assert _data_path([str(data), "hf://datasets/o/n/x.parquet", "~/d/*.parquet"], str(tmp_path), "t") == [
        str(data), "hf://datasets/o/n/x.parquet", "~/d/*.parquet"]


def test_rows_whose_column_mixes_types_name_the_data_set_column_and_row(tmp_path):
    """issue 39: pyarrow's 'Could not convert 2 with type int: tried to convert to string' named no column or row."""
    from npu_rl.data.io import DataError

    rows = [{"prompt": "1+1?", "answer": "2"}, {"prompt": "2+2?", "answer": "4"}, {"prompt": "3+3?", "answer": 6}]
    with pytest.raises(DataError, match=r"^train_dataset: cannot write .*train_dataset.parquet: column "
                                        r"'reward_model.ground_truth', row 2: 6 is a int, but row 0 holds a str"):
        _data_path(rows, str(tmp_path), "train_dataset")
