"""Every shipped Triton kernel through triton-ascend's own front end (Triton IR -> linalg), with the 910B tiles.

triton-ascend installs as ``triton``, so it lives in an environment of its own: ``NPU_RL_TRITON_ASCEND_PYTHON``
(default ``/tmp/ta-venv/bin/python``; docs/npu.md says how to make it). The last stage, linalg -> AI-core binary,
is CANN's ``bishengir-compile`` and is not run here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from tests.conftest import REPO_ROOT

PYTHON = os.environ.get("NPU_RL_TRITON_ASCEND_PYTHON", "/tmp/ta-venv/bin/python")


def _launched_kernels() -> set[str]:
    """Names of the @triton.jit functions the launchers call with a grid (``name[grid](...)``)."""
    names = set()
    for file in ("triton_linear.py", "policy_triton.py"):
        text = open(os.path.join(REPO_ROOT, "kernels", file), encoding="utf-8").read()
        names |= set(re.findall(r"\b(_\w+)\[[^\]]*\]\(", text))
    return names


def test_the_lowering_covers_every_launched_kernel():
    text = open(os.path.join(REPO_ROOT, "kernels", "ascend_lowering.py"), encoding="utf-8").read()
    launched = _launched_kernels()
    assert launched == {"_fwd_kernel", "_bwd_kernel", "_fwd", "_bwd"}
    for name in launched:
        assert f"._{name.lstrip('_')}," in text or f".{name}," in text, name


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(PYTHON), reason=f"no triton-ascend environment at {PYTHON}")
def test_every_kernel_lowers_to_linalg_for_the_910b(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the compiler, not the interpreter
    out = subprocess.run([PYTHON, "-m", "npu_rl.kernels.ascend_lowering", "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO_ROOT, env={**env, "PYTHONPATH": REPO_ROOT},
                         timeout=600)
    report = json.loads((tmp_path / "report.json").read_text())
    assert out.returncode == 0, out.stderr[-3000:]
    assert report["triton"].startswith("3.2") and report["arch"] == "Ascend910B3"
    assert report["tiles"]["fused"]["block_n"] * report["tiles"]["fused"]["block_v"] * 4 <= 128 * 1024  # L0C
    assert len(report["kernels"]) == 12 and all(k["ok"] for k in report["kernels"].values())
    fused = (tmp_path / "fwd_kernel.fused.kl0.linalg.mlir").read_text()
    assert "linalg.matmul" in fused and "func.func" in fused
