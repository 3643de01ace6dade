"""Kernel tests run on the process's device: the accelerator when there is one (compiled Triton), else the CPU, where
Triton kernels run in its interpreter (TRITON_INTERPRET=1, set by tests/conftest.py before any test module imports
Triton)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from npu_rl.device import get_backend

ON_CPU = get_backend().name == "cpu"
HAS_TRITON = importlib.util.find_spec("triton") is not None


@pytest.fixture(scope="session")
def device() -> torch.device:
    return get_backend().device()


@pytest.fixture
def needs_triton():
    if not HAS_TRITON:
        pytest.skip("triton is not installed (pip install triton; triton-ascend on Ascend)")
    if ON_CPU and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("on CPU the Triton tests need TRITON_INTERPRET=1")

