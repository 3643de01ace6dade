"""The Atlas cluster path rehearsed on one machine, as a user runs it.

``scripts/atlas/start_ray_head.sh`` and ``start_ray_worker.sh`` start two Ray nodes here (two raylets; CPUs stand
in for NPUs: one CPU per node, so each node holds one rank; the environment is the NPU one, ``scripts/atlas/env.sh``
sourcing a CANN ``set_env.sh``, and ``scripts/runtime_env.yaml``), and the seeds' DAPO script
(``scripts/run_dapo_qwen2.5_32b_npu.sh``) is submitted to them with ``ray job submit``, its own way. What the
test appends to the script's keys (``"$@"``), and why:

- the model: a tiny random Qwen2 (no weights can be fetched here), with lengths and batch sizes a CPU can take;
- device counts: 2 nodes x 1 device, sequence parallel and rollout TP 1, ``trainer.device=cpu``, the ``hf`` rollout
  (vLLM-Ascend needs an NPU), console logging (no wandb here);
- step count: 3 steps, a checkpoint after every step; a reward that varies within groups (DAPO's filter drops
  groups whose accuracy is constant, and a random model's would always be 0).

Steps 1 and 2 train across both nodes and are checkpointed; during step 3 the worker node is stopped with
``scripts/atlas/stop_ray.sh`` (its own Ray instance only). The job must then fail with an error that says a worker
died, and the step-2 checkpoint must verify and resume.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO_ROOT
from tests.e2e.test_ray_job import _clone

pytestmark = pytest.mark.ray

ATLAS = os.path.join(REPO_ROOT, "scripts", "atlas")
RAY_OVERLOADED = "The current node timed out during startup"

REWARD = """\
import os
import time
import zlib

MARK = {mark!r}
CKPT = {ckpt!r}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    # step 3 runs once step 2's checkpoint is marked: say so (once) and give the test time to stop the worker node
    marker = os.path.join(CKPT, "latest_checkpointed_iteration.txt")
    if os.path.exists(marker) and open(marker).read().strip() == "2":
        try:
            os.close(os.open(MARK, os.O_CREAT | os.O_EXCL))
            time.sleep(5)
        except FileExistsError:
            pass
    acc = float(zlib.crc32(solution_str.encode()) % 2)
    return {{"score": acc, "acc": acc}}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_data(path: str, n: int) -> str:
    import pandas as pd

    rows = [{"data_source": "rehearsal", "prompt": [{"role": "user", "content": f"{i} + {i} ="}],
             "reward_model": {"style": "rule", "ground_truth": str(2 * i)}, "extra_info": {"index": i}}
            for i in range(n)]
    pd.DataFrame(rows).to_parquet(path)
    return path


def _run_script(path: str, env: dict, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """Like a command typed in a terminal: its own process group (a shell's job), which Ray's daemons inherit and
    stop_ray.sh signals; never this test's group."""
    return subprocess.run(["bash", path, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          start_new_session=True)


def _stop(env: dict, ray_tmp: str) -> None:
    _run_script(os.path.join(ATLAS, "stop_ray.sh"), {**env, "RAY_TMP": ray_tmp}, timeout=60)
    # a node that failed to start leaves helpers (log monitor) outside stop_ray.sh's group: end them by name
    leftover = subprocess.run(["pgrep", "-f", f"{ray_tmp}/"], capture_output=True, text=True).stdout.split()
    for pid in leftover:
        try:
            os.kill(int(pid), 9)
        except OSError:
            pass


@pytest.fixture
def cluster(tmp_path):
    """Head + worker started by the Atlas scripts; stopped by stop_ray.sh (each instance only) whatever happens."""
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    if not os.path.isfile(ray_bin):
        pytest.skip("ray is not installed")
    cann = tmp_path / "Ascend" / "ascend-toolkit"
    cann.mkdir(parents=True)
    (cann / "set_env.sh").write_text('export ASCEND_TOOLKIT_HOME=/cann\nexport LD_LIBRARY_PATH=/cann/lib64:'
                                     '${LD_LIBRARY_PATH}\n')
    port, dash = _free_port(), _free_port()
    head_tmp, worker_tmp = f"/tmp/nrl_h{os.getpid()}", f"/tmp/nrl_w{os.getpid()}"  # short: unix sockets below
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS", "VIRTUAL_ENV")}
    env.update(PATH=f"{os.path.dirname(sys.executable)}:{env.get('PATH', '')}", RAY_AUTH_MODE="disabled",
               ASCEND_HOME=str(tmp_path / "Ascend"), DEVICE="cpu", HEAD_IP="127.0.0.1", NODE_IP="127.0.0.1",
               RAY_PORT=str(port), DASHBOARD_PORT=str(dash), NPUS_PER_NODE="1", OMP_NUM_THREADS="1",
               RAY_START_ARGS="--num-cpus=1 --object-store-memory=80000000", HF_HUB_OFFLINE="1", NPU_RL_DOCTOR="0")
    _log("cluster start")
    try:
        for script, ray_tmp in (("start_ray_head.sh", head_tmp), ("start_ray_worker.sh", worker_tmp)):
            for _ in range(3):  # Ray gives a raylet 30 s to register: an overloaded machine can miss that
                out = _run_script(os.path.join(ATLAS, script), {**env, "RAY_TMP": ray_tmp})
                if out.returncode == 0 or RAY_OVERLOADED not in out.stdout + out.stderr:
                    break
                _stop(env, ray_tmp)
            if out.returncode != 0 and RAY_OVERLOADED in out.stdout + out.stderr:
                # Ray's own start-up deadline (30 s, fixed in ray/_private/node.py), missed three times: the
                # machine is too loaded to hold a cluster, which says nothing about the scripts
                pytest.skip(f"{script}: Ray's raylet did not register within its 30 s, three times (load "
                            f"{os.getloadavg()[0]:.0f})")
            assert out.returncode == 0, f"{script}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
            _log(f"{script} done")
        yield {"env": env, "address": f"http://127.0.0.1:{dash}", "worker_tmp": worker_tmp, "head_tmp": head_tmp}
    finally:
        _stop(env, worker_tmp)
        _stop(env, head_tmp)
        for path in (head_tmp, worker_tmp):
            shutil.rmtree(path, ignore_errors=True)


def _overrides(model_dir: str, reward: str, ckpt: str) -> list[str]:
    return [
        # the model, and sizes a CPU can take
        f"actor_rollout_ref.model.path={model_dir}", "data.max_prompt_length=96", "data.max_response_length=8",
        "data.train_batch_size=4", "data.gen_batch_size=4", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "reward_model.overlong_buffer.len=4",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=512",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=512",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=512",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        f"custom_reward_function.path={reward}", "custom_reward_function.name=compute_score",
        # device counts: 2 nodes x 1 device, no sequence / tensor parallelism, CPU, the hf rollout
        "trainer.nnodes=2", "trainer.n_gpus_per_node=1", "trainer.device=cpu",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.name=hf",
        "trainer.logger=[console]", "trainer.val_before_train=False",
        # step count: 3 steps, a checkpoint after each
        "trainer.total_training_steps=3", "trainer.save_freq=1",
    ]


def _log(what: str, start=[]) -> None:  # noqa: B006 (the first call's time)
    start.append(start[0] if start else time.monotonic())
    print(f"rehearsal: {what} at {time.monotonic() - start[0]:.1f} s", file=sys.stderr, flush=True)


def _wait(client, job_id: str, until, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = str(client.get_job_status(job_id)).split(".")[-1]
        if until(status):
            return status
        if status in ("FAILED", "STOPPED", "SUCCEEDED"):
            return status
        time.sleep(1)
    pytest.fail(f"{what}: timed out; job logs:\n{client.get_job_logs(job_id)[-4000:]}")


def test_dapo_script_on_two_ray_nodes_then_the_worker_node_dies(cluster, tmp_path, tiny_model_dir):
    from ray.job_submission import JobSubmissionClient

    from npu_rl.trainer.checkpoint import latest_step, saved_steps, step_dir, verify_step

    env, address = cluster["env"], cluster["address"]
    clone = str(tmp_path / "clone")
    _clone(clone)
    ckpt, mark = str(tmp_path / "ckpts"), str(tmp_path / "step3_started")
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD.format(mark=mark, ckpt=ckpt))
    data = tmp_path / "data"
    data.mkdir()
    script_env = {**env, "RAY_ADDRESS": address, "WORKING_DIR": clone, "NNODES": "2", "CKPTS_DIR": ckpt,
                  "MODEL_PATH": tiny_model_dir, "TRAIN_FILE": _write_data(str(data / "train.parquet"), 8),
                  "TEST_FILE": _write_data(str(data / "test.parquet"), 4)}
    deadline = time.monotonic() + 240
    while True:  # the head's job agent registers a little after the dashboard answers
        out = _run_script(os.path.join(REPO_ROOT, "scripts", "run_dapo_qwen2.5_32b_npu.sh"), script_env,
                          *_overrides(tiny_model_dir, str(reward), ckpt))
        if out.returncode == 0 or "No available agent" not in out.stderr + out.stdout or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    job_id = next(word.strip("'") for line in out.stdout.splitlines() if "submitted successfully" in line
                  for word in line.split() if word.strip("'").startswith("raysubmit_"))
    client = JobSubmissionClient(address)
    _log("job submitted")
    status = _wait(client, job_id, lambda s: os.path.exists(mark), 240, "steps 1-2")
    logs = client.get_job_logs(job_id)
    assert status == "RUNNING" and os.path.exists(mark), f"{status}\n{logs[-4000:]}"
    # steps 1 and 2 ran on both nodes and were checkpointed
    assert latest_step(ckpt) == 2 and saved_steps(ckpt) == [1, 2], logs[-3000:]
    _log("step 3 started")
    _stop(env, cluster["worker_tmp"])  # the worker node goes away in the middle of step 3
    _log("worker node stopped")
    status = _wait(client, job_id, lambda s: False, 120, "the job after the worker node died")
    logs = client.get_job_logs(job_id)
    _log("job ended")
    assert status == "FAILED", logs[-4000:]
    assert "npu-rl: a Ray worker died while running actor_rollout." in logs, logs[-4000:]
    assert f"the last checkpoint is step 2 in {ckpt}" in logs and "trainer.resume_mode=auto" in logs, logs[-4000:]
    assert latest_step(ckpt) == 2
    verify_step(step_dir(ckpt, 2))  # the checkpoint the job left is whole
    # both ranks reported (one CPU per node: rank 0 on the head, rank 1 on the worker node)
    rows = [json.loads(line) for path in sorted(os.listdir(os.path.join(ckpt, "logs")))
            for line in open(os.path.join(ckpt, "logs", path, "metrics.jsonl"))]
    steps = {row["step"]: row for row in rows if "actor/pg_loss" in row}
    assert sorted(steps) == [1, 2] and steps[2]["perf/num_memory_reports"] == 2


def test_a_dead_worker_is_named_with_the_checkpoint_and_the_resume_command(tmp_path, capsys):
    """The message the rehearsal expects, from Ray's ActorDiedError text (no cluster needed)."""
    from npu_rl.config.loader import load_config
    from npu_rl.controller.ray_group import WorkerLostError, _first_lines
    from npu_rl.trainer.checkpoint import MARKER
    from npu_rl.trainer.interrupt import set_command
    from npu_rl.trainer.run import _worker_lost

    ray_text = ("The actor died unexpectedly before finishing this task.\n\tclass_name: WorkerHost\n\tip: 10.0.0.2\n"
                "The actor died because its node has died. Node Id: 40cc\n\tthe actor's node was terminated "
                "expectedly: received SIGTERM")
    why = _first_lines(RuntimeError(ray_text))
    assert "ip: 10.0.0.2" in why and "the actor's node was terminated" in why and "class_name" not in why
    (tmp_path / "global_step_2").mkdir()
    (tmp_path / "global_step_2" / "trainer_state.pt").write_bytes(b"")
    (tmp_path / MARKER).write_text("2")
    config = load_config([f"trainer.default_local_dir={tmp_path}"], "ppo_trainer")
    set_command(["python3", "-m", "npu_rl.trainer.main_ppo", "preset=dapo", "trainer.resume_mode=disable"])
    _worker_lost(config, WorkerLostError(f"a Ray worker died while running actor_rollout.update_policy: {why}"))
    err = capsys.readouterr().err
    assert f"the last checkpoint is step 2 in {tmp_path}" in err
    assert "python3 -m npu_rl.trainer.main_ppo preset=dapo trainer.resume_mode=auto" in err
