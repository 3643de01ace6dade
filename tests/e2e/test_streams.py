"""Quiet by default: vLLM's logging is configured before it starts (stderr, harmless messages dropped with their
tracebacks); notes only for keys the user set; ``npu-rl eval`` keeps stdout for its JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

_VLLM_PROBE = r"""
import logging, os, sys
from npu_rl.utils.logs import configure_vllm_logging
path = configure_vllm_logging()
logging.getLogger("vllm.triton_utils.importing").warning("Chat template warmup failed (at import time)")
from vllm.config.logging import LoggingConfig
from vllm.logger import configure_logging_if_needed
configure_logging_if_needed(LoggingConfig())  # what LLM(...) does first: its fields default to VLLM_* variables
log = logging.getLogger("vllm.renderers.base")
try:
    raise RuntimeError("no tokenizer")
except RuntimeError:
    log.warning("Chat template warmup failed", exc_info=True)
log.warning("a real warning %d", 7)
logging.getLogger("vllm.config.vllm").warning("Enforce eager set, disabling torch.compile, CUDAGraphs")
log.info("an info line")
print("RESULT", path)
"""


def _env(tmp_path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, NPU_RL_CACHE=str(tmp_path))
    for key in ("VLLM_LOGGING_CONFIG_PATH", "NPU_RL_VLLM_LOGGING_CONFIG", "VLLM_LOGGING_LEVEL", "VLLM_CONFIGURE_LOGGING"):
        env.pop(key, None)
    return env


@pytest.mark.vllm
def test_vllm_logs_go_to_stderr_without_the_warmup_traceback(tmp_path):
    pytest.importorskip("vllm")
    out = subprocess.run([sys.executable, "-c", _VLLM_PROBE], env=_env(tmp_path), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == f"RESULT {tmp_path / 'vllm_logging_warning.json'}"
    assert "a real warning 7" in out.stderr and "a real warning" not in out.stdout
    assert "Chat template warmup failed" not in out.stderr + out.stdout
    assert "Traceback" not in out.stderr and "no tokenizer" not in out.stderr
    assert "an info line" not in out.stderr  # WARNING by default
    assert "Enforce eager set" not in out.stderr


def test_a_users_own_vllm_logging_config_is_kept(tmp_path, monkeypatch):
    from npu_rl.utils.logs import configure_vllm_logging

    mine = tmp_path / "mine.json"
    mine.write_text("{}")
    monkeypatch.setenv("NPU_RL_CACHE", str(tmp_path))
    monkeypatch.delenv("NPU_RL_VLLM_LOGGING_CONFIG", raising=False)
    monkeypatch.setenv("VLLM_LOGGING_CONFIG_PATH", str(mine))
    assert configure_vllm_logging() is None and os.environ["VLLM_LOGGING_CONFIG_PATH"] == str(mine)
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "info")
    path = configure_vllm_logging()
    with open(path) as f:
        assert json.load(f)["loggers"]["vllm"]["level"] == "INFO"
    monkeypatch.setenv("VLLM_CONFIGURE_LOGGING", "0")
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH")
    assert configure_vllm_logging() is None


def test_notes_only_for_keys_the_user_set(capsys):
    from npu_rl.trainer.main_ppo import main

    assert main(["--cfg", "job"], default_config="quickstart") == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "note:" in line]
    # at most the device's dtype choice (a CPU without native bf16: trainer/preflight.host_dtype_overrides)
    assert all("computes in fp32" in line for line in notes), notes
    assert main(["--cfg", "job", "actor_rollout_ref.actor.entropy_checkpointing=true"],
                default_config="quickstart") == 0
    err = capsys.readouterr().err
    assert "actor_rollout_ref.actor.entropy_checkpointing=True has no effect" in err
