"""Outputs written atomically (a temporary file or folder, then a rename) get the user's umask, not mkstemp's /
mkdtemp's owner-only 0600 / 0700."""

from __future__ import annotations

import os
import stat

import pytest

from npu_rl.commands.merge import staged_output
from npu_rl.data.io import write_parquet


@pytest.fixture(params=[0o022, 0o077, 0o002])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_parquet_and_merged_folders_follow_the_umask(tmp_path, umask):
    path = write_parquet([{"a": 1}], str(tmp_path / "d" / "train.parquet"))
    assert _mode(path) == 0o666 & ~umask
    out = tmp_path / "merged"
    with staged_output(str(out)) as staging:
        os.makedirs(os.path.join(staging, "sub"))
        with open(os.path.join(staging, "sub", "model.safetensors"), "w") as f:
            f.write("x")
    assert _mode(out) == 0o777 & ~umask
    assert _mode(out / "sub") == 0o777 & ~umask
    assert _mode(out / "sub" / "model.safetensors") == 0o666 & ~umask
