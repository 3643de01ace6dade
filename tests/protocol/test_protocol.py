"""Batch: the container the controller splits and gathers."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from npu_rl.protocol import Batch


def make(n=4) -> Batch:
    return Batch({"x": torch.arange(n * 2).view(n, 2)}, {"uid": [f"u{i}" for i in range(n)]}, {"temperature": 1.0})


def test_split_concat_round_trip():
    b = make(5)
    parts = b.split(2)
    assert [len(p) for p in parts] == [2, 2, 1]
    back = Batch.concat(parts)
    torch.testing.assert_close(back["x"], b["x"])
    assert list(back["uid"]) == list(b["uid"]) and back.meta == {"temperature": 1.0}


def test_repeat_interleave_and_tile():
    b = make(2)
    assert list(b.repeat(2)["uid"]) == ["u0", "u0", "u1", "u1"]
    assert list(b.repeat(2, interleave=False)["uid"]) == ["u0", "u1", "u0", "u1"]
    torch.testing.assert_close(b.repeat(2)["x"], torch.tensor([[0, 1], [0, 1], [2, 3], [2, 3]]))


def test_index_by_mask_and_indices():
    b = make(4)
    kept = b.index(torch.tensor([True, False, True, False]))
    assert list(kept["uid"]) == ["u0", "u2"]
    assert list(b.index(np.array([3, 0]))["uid"]) == ["u3", "u0"]


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="disagree on the batch size"):
        Batch({"x": torch.zeros(3)}, {"uid": ["a", "b"]})
    b = make(2)
    with pytest.raises(ValueError, match="field 'y' has 3 rows, the batch has 2"):
        b["y"] = torch.zeros(3)


def test_chunk_requires_even_split_and_select_names_missing():
    with pytest.raises(ValueError, match="cannot chunk a batch of 5 rows into 2"):
        make(5).chunk(2)
    with pytest.raises(KeyError, match="missing fields \\['nope'\\]"):
        make().select(["nope"])


def test_pickles():
    b = pickle.loads(pickle.dumps(make(3)))
    assert len(b) == 3 and b.meta["temperature"] == 1.0
