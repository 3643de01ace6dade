"""The environment Ascend workers start with, and the Atlas shell scripts (no NPU needed)."""

from __future__ import annotations

import os
import subprocess

from npu_rl.device.npu_env import worker_process_env
from tests.conftest import REPO_ROOT

ATLAS = os.path.join(REPO_ROOT, "scripts", "atlas")


def test_worker_env_turns_nz_off_with_sleep_mode_and_passes_task_queue_on(monkeypatch):
    monkeypatch.delenv("TASK_QUEUE_ENABLE", raising=False)
    monkeypatch.setenv("VLLM_ASCEND_ENABLE_NZ", "1")
    assert worker_process_env("cpu", sleep_mode=True) == {}
    assert worker_process_env("npu", sleep_mode=True) == {"TASK_QUEUE_ENABLE": "1", "VLLM_ASCEND_ENABLE_NZ": "0"}
    assert worker_process_env("npu", sleep_mode=False)["VLLM_ASCEND_ENABLE_NZ"] == "1"  # the user's, no sleep
    monkeypatch.setenv("TASK_QUEUE_ENABLE", "2")
    assert worker_process_env("npu", sleep_mode=True)["TASK_QUEUE_ENABLE"] == "2"


def _source_env(tmp_path, extra: str = "") -> dict[str, str]:
    """Source env.sh under `set -euo pipefail` with a CANN set_env.sh that reads unset variables (as the real one
    does with LD_LIBRARY_PATH); returns the environment it exported."""
    home = tmp_path / "Ascend"
    (home / "ascend-toolkit").mkdir(parents=True, exist_ok=True)
    (home / "ascend-toolkit" / "set_env.sh").write_text(
        'export LD_LIBRARY_PATH=/cann/lib64:${LD_LIBRARY_PATH}\nexport ASCEND_TOOLKIT_HOME=/cann\n')
    script = f"set -euo pipefail\n{extra}\nsource {ATLAS}/env.sh\necho \"nounset=$(case $- in *u*) echo on;; esac)\"\nenv"
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "TASK_QUEUE_ENABLE",
                                                            "VLLM_ASCEND_ENABLE_NZ", "HCCL_EXEC_TIMEOUT",
                                                            "CPU_AFFINITY_CONF")}
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={**env, "ASCEND_HOME": str(home)})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "nounset=on"  # set -u is back on after CANN's script
    return dict(line.split("=", 1) for line in lines[1:] if "=" in line)


def test_env_sh_sources_cann_under_set_u_and_sets_only_useful_variables(tmp_path):
    env = _source_env(tmp_path)
    assert env["ASCEND_TOOLKIT_HOME"] == "/cann" and env["LD_LIBRARY_PATH"].startswith("/cann/lib64")
    assert (env["TASK_QUEUE_ENABLE"], env["VLLM_ASCEND_ENABLE_NZ"], env["DEVICE"]) == ("1", "0", "npu")
    assert env["HCCL_CONNECT_TIMEOUT"] == "1800" and env["CPU_AFFINITY_CONF"] == "1"
    assert "HCCL_EXEC_TIMEOUT" not in env  # 1800 would lower HCCL's 1836 s default
    assert "ASCEND_RT_VISIBLE_DEVICES" not in env  # Ray counts the NPUs
    assert _source_env(tmp_path, "export TASK_QUEUE_ENABLE=2")["TASK_QUEUE_ENABLE"] == "2"


def test_ray_scripts_offer_detected_npus_unless_told_and_never_stop_everyones_ray():
    for name in ("start_ray_head.sh", "start_ray_worker.sh", "stop_ray.sh", "ray_common.sh"):
        text = open(os.path.join(ATLAS, name), encoding="utf-8").read()
        assert "ray stop" not in text.replace("`ray stop --force` would", ""), name
    common = f"source {ATLAS}/ray_common.sh; echo \"[$(npu_resource_args)]\""
    run = lambda extra: subprocess.run(["bash", "-c", extra + common], capture_output=True, text=True).stdout.strip()
    assert run("unset NPUS_PER_NODE; ") == "[]"
    assert run("NPUS_PER_NODE=16; ") == '[--resources={"NPU":16}]'


def test_worker_env_passes_binding_and_hccl_settings_on(monkeypatch):
    for name in ("CPU_AFFINITY_CONF", "HCCL_BUFFSIZE", "HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE"):
        monkeypatch.delenv(name, raising=False)
    env = worker_process_env("npu", sleep_mode=True)
    assert not {"CPU_AFFINITY_CONF", "HCCL_BUFFSIZE", "HCCL_HOST_SOCKET_PORT_RANGE"} & set(env)  # HCCL's defaults
    monkeypatch.setenv("CPU_AFFINITY_CONF", "2")
    monkeypatch.setenv("HCCL_BUFFSIZE", "512")
    env = worker_process_env("npu", sleep_mode=True)
    assert (env["CPU_AFFINITY_CONF"], env["HCCL_BUFFSIZE"]) == ("2", "512")
    shared = worker_process_env("npu", sleep_mode=True, processes_per_device=2)  # several processes on one NPU
    assert shared["HCCL_HOST_SOCKET_PORT_RANGE"] == shared["HCCL_NPU_SOCKET_PORT_RANGE"] == "auto"
    monkeypatch.setenv("HCCL_NPU_SOCKET_PORT_RANGE", "61000-61050")  # a user's range is kept
    assert worker_process_env("npu", sleep_mode=True, processes_per_device=2)["HCCL_NPU_SOCKET_PORT_RANGE"] == \
        "61000-61050"
    assert worker_process_env("cpu", sleep_mode=True) == {}
