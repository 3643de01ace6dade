"""`ray job submit --working-dir <clone>` runs npu-rl from the uploaded folder alone: its configs and kernels, not
those of the npu-rl installed on the node (here the shared venv has one installed, editable, elsewhere).

A private Ray head is started with ``ray start --head --block`` in its own process group and its own temp dir, and
stopped by ending that group: other Ray instances on the machine are never touched (no ``ray stop``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.ray


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clone(dest: str) -> None:
    """The files a fresh clone has (tracked + untracked-not-ignored): no development symlinks, no venv."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO_ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = os.path.join(REPO_ROOT, rel)
        if os.path.isfile(src) and not os.path.islink(src) and not rel.startswith("tests/"):
            os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    if not os.path.isfile(ray_bin):
        pytest.skip("ray is not installed")
    temp_dir = f"/tmp/npu_rl_rayjob_{os.getpid()}"  # short: Ray's unix sockets live below it
    port, dash = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    env.update(RAY_AUTH_MODE="disabled", PATH=f"{os.path.dirname(sys.executable)}:{env.get('PATH', '')}")
    head = subprocess.Popen(
        [ray_bin, "start", "--head", "--block", f"--port={port}", "--num-cpus=1", "--num-gpus=0",
         "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
         f"--temp-dir={temp_dir}", "--object-store-memory=100000000", "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                import urllib.request

                with urllib.request.urlopen(f"{address}/api/version", timeout=2):
                    break
            except OSError:
                if head.poll() is not None or time.monotonic() > deadline:
                    pytest.skip(f"ray start --head did not come up: {head.stderr.read().decode()[-1500:]}")
                time.sleep(1)
        yield address, env
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # --block: ray start stops what it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)


PROBE = ("import json, npu_rl, npu_rl.configs, npu_rl.kernels; "
         "from npu_rl.config.loader import load_config; "
         "c = load_config([], 'quickstart'); "
         "print('PROBE', json.dumps([npu_rl.__file__, npu_rl.configs.__file__, npu_rl.kernels.__file__, "
         "c.trainer.experiment_name]))")


def test_a_job_runs_from_the_uploaded_folder(ray_head, tmp_path):
    address, env = ray_head
    clone = str(tmp_path / "clone")
    _clone(clone)
    quickstart = os.path.join(clone, "configs", "quickstart.yaml")
    text = open(quickstart).read().replace("experiment_name: quickstart_arith_grpo", "experiment_name: uploaded_copy")
    open(quickstart, "w").write(text)  # an edit made in the uploaded folder only
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    deadline = time.monotonic() + 120
    while True:  # the head's job agent registers a little after the dashboard answers
        out = subprocess.run(
            [ray_bin, "job", "submit", f"--address={address}", f"--working-dir={clone}",
             "--runtime-env=" + os.path.join(clone, "scripts", "runtime_env.yaml"), "--",
             sys.executable, "-c", PROBE],
            env=env, capture_output=True, text=True, timeout=300)
        if "No available agent" not in out.stderr or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = next(l for l in out.stdout.splitlines() if l.startswith("PROBE "))
    package, configs, kernels, experiment = json.loads(line[len("PROBE "):])
    for path in (package, configs, kernels):
        assert "/runtime_resources/working_dir_files/" in path, path  # the uploaded copy, not /work/main
    assert experiment == "uploaded_copy"


def test_runtime_env_keeps_the_cli_cache_folder():
    """Ray jobs use the same cache folder as the CLI ($NPU_RL_CACHE, else ~/.cache/npu_rl)."""
    import yaml

    with open(os.path.join(REPO_ROOT, "scripts", "runtime_env.yaml")) as f:
        env = yaml.safe_load(f)
    assert "NPU_RL_CACHE" not in env.get("env_vars", {})
