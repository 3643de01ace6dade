"""Every data test writes built-in data sets into its own cache folder, never into ~/.cache."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NPU_RL_CACHE", str(tmp_path / "npu_rl_cache"))
