"""Kills and interrupts of the asynchronous trainers, run as a user runs them: the entry-point module in a process of
its own (its own Ray cluster), killed or interrupted from outside, then the same command again.

- fully async, the trainer and the rollout pool each a Ray worker pool: SIGKILL of the whole process group in the
  middle of a step leaves no process of the run behind; the same command resumes from the last whole step, the pool
  takes the loaded weights first, the queue's prompts are dropped and counted, the version accounting and the prompt
  stream continue; Ctrl-C (SIGINT to the process group, as a terminal sends it) finishes and saves the step, drains
  and closes the pool, exits 130; the same command then reaches trainer.total_training_steps.
- one-step off-policy: SIGTERM to the driver (as ``kill PID`` sends it) saves the step, drains the pool, exits 143;
  the same command resumes. A second Ctrl-C stops at once: exit 130 said in words, no traceback, nothing left.

The signal and the hold come from the reward function at a known call (so at a known step); every process the run
starts carries a tag in its environment, which is how the test finds what is left of it.
"""

from __future__ import annotations

import glob
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from npu_rl.trainer.checkpoint import STATE_FILE, latest_step, saved_steps, step_dir, verify_step
from npu_rl.utils.safe_load import load_state
from tests.e2e.test_one_step_off import async_overrides
from tests.conftest import REPO_ROOT
from tests.trainer.conftest import step_rows

pytest.importorskip("ray")

FULLY_ASYNC = "npu_rl.experimental.fully_async_policy.fully_async_main"
ONE_STEP_OFF = "npu_rl.experimental.one_step_off_policy.main_ppo"
N = 4  # actor_rollout_ref.rollout.n (base_overrides)
LEFT_BEHIND_S = 60  # a killed run's Ray workers notice their raylet is gone within seconds; the bound is generous

REWARD = textwrap.dedent("""\
    import os
    import signal
    import time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        counter = os.environ.get("FAULT_COUNTER")
        if counter:
            calls = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
            with open(counter, "w") as f:
                f.write(str(calls))
            if calls == int(os.environ.get("FAULT_HOLD_AT", "0")):  # the step stops here until the test kills it
                open(os.environ["FAULT_HOLDING"], "w").close()
                time.sleep(3600)
            if calls in [int(at) for at in os.environ.get("FAULT_SIGNAL_AT", "0").split(",")]:
                sig = getattr(signal, os.environ["FAULT_SIGNAL"])
                if os.environ.get("FAULT_SIGNAL_GROUP") == "1":
                    os.killpg(os.getpgid(0), sig)  # a terminal's Ctrl-C: every process of the foreground group
                else:
                    os.kill(os.getpid(), sig)
        sevens = solution_str.count("7")
        return {"score": sevens / max(len(solution_str), 1), "acc": float(sevens > 0)}
    """)


@pytest.fixture
def reward(tmp_path) -> str:
    path = tmp_path / "reward_faults.py"
    path.write_text(REWARD)
    return str(path)


def fully_async_argv(model_dir, out, reward, steps: int) -> list[str]:
    """test_fully_async's run (2 prompts x 4 samples per update, a push every 2 updates, staleness 0.5), saving
    every step, resuming when it can, the trainer in a Ray worker pool of its own."""
    return [o for o in async_overrides(model_dir, out, reward) if not o.startswith("trainer.resume_mode=")] + [
        "preset=grpo", f"trainer.total_training_steps={steps}", "trainer.test_freq=0", "trainer.save_freq=1",
        "trainer.val_before_train=False", "trainer.resume_mode=auto", "data.train_batch_size=0",
        "async_training.staleness_threshold=0.5", "async_training.trigger_parameter_sync_step=2",
        "async_training.require_batches=1", "rollout.total_rollout_steps=null", "trainer.controller=ray",
        "ray_kwargs.ray_init.num_cpus=4"]


class Run:
    """One process of the entry point, in a process group of its own; output in a file (no pipe to fill)."""

    def __init__(self, module: str, argv: list[str], log: str, tag: str, **faults: str):
        self.log, self.tag = log, tag
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO_ROOT, "DEVICE": "cpu",
               "NPU_RL_TEST_RUN": tag}
        env.update(faults)
        with open(log, "w") as f:
            self.proc = subprocess.Popen([sys.executable, "-m", module, *argv], cwd=REPO_ROOT, env=env, stdout=f,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def output(self) -> str:
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()

    def wait(self, timeout: float = 420) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the run did not finish within {timeout} s:\n{self.output[-4000:]}")

    def wait_for(self, path: str, timeout: float = 420) -> None:
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            if self.proc.poll() is not None:
                pytest.fail(f"the run exited ({self.proc.returncode}) before {path} appeared:\n{self.output[-4000:]}")
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"{path} did not appear within {timeout} s:\n{self.output[-4000:]}")
            time.sleep(0.2)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def processes_of(tag: str) -> list[str]:
    """Live (not zombie) processes whose environment carries the run's tag: 'pid command'."""
    found = []
    for environ in glob.glob("/proc/[0-9]*/environ"):
        pid = environ.split("/")[2]
        try:
            if f"NPU_RL_TEST_RUN={tag}".encode() not in open(environ, "rb").read().split(b"\0"):
                continue
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state != "Z":
            found.append(f"{pid} {command}")
    return found


def assert_nothing_left(tag: str, what: str) -> None:
    deadline = time.monotonic() + LEFT_BEHIND_S
    while (left := processes_of(tag)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"{what}: processes of the run still alive after {LEFT_BEHIND_S} s: {left}"


def trainer_state(out: str, step: int) -> dict:
    verify_step(step_dir(out, step))
    return load_state(os.path.join(step_dir(out, step), STATE_FILE))


def consumed_prompts(loader_state: dict) -> int:
    """Prompts the stream has handed out, from the data loader's saved position."""
    size, rows = int(loader_state["batch_size"]), int(loader_state["num_rows"])
    assert rows % size == 0
    return (int(loader_state["epoch"]) * (rows // size) + int(loader_state["batches_done"])) * size


def test_fully_async_resumes_after_sigkill_and_drains_on_ctrl_c(tiny_model_dir, tmp_path, reward):
    out = str(tmp_path / "run")
    argv = fully_async_argv(tiny_model_dir, out, reward, steps=8)
    rows_per_step = 2 * N
    tag = uuid.uuid4().hex

    # 1. the reward holds in step 5 (steps 1-4 saved) while the rollouter fills the queue; SIGKILL the group
    holding = str(tmp_path / "holding")
    first = Run(FULLY_ASYNC, argv, str(tmp_path / "first.log"), tag, FAULT_COUNTER=str(tmp_path / "calls1"),
                FAULT_HOLD_AT=str(4 * rows_per_step + 3), FAULT_HOLDING=holding)
    first.wait_for(holding)
    assert latest_step(out) == 4 and saved_steps(out) == [1, 2, 3, 4]
    alive = processes_of(tag)
    assert sum("ray::" in p for p in alive) >= 2, alive  # the trainer's and the rollout pool's actors
    os.killpg(first.proc.pid, signal.SIGKILL)
    assert first.proc.wait() == -signal.SIGKILL
    assert_nothing_left(tag, "after SIGKILL of the driver's process group")
    # a save cut off by a kill leaves its .tmp folder: never read, removed by the next save
    os.makedirs(os.path.join(out, "global_step_5.tmp", "actor"))
    with open(os.path.join(out, "global_step_5.tmp", STATE_FILE), "wb") as f:
        f.write(b"half")

    # 2. the same command: resumes from step 4; Ctrl-C to the process group in step 6's reward phase
    second = Run(FULLY_ASYNC, argv, str(tmp_path / "second.log"), tag, FAULT_COUNTER=str(tmp_path / "calls2"),
                 FAULT_SIGNAL_AT=str(rows_per_step + 3), FAULT_SIGNAL="SIGINT", FAULT_SIGNAL_GROUP="1")
    assert second.wait() == 130, second.output[-4000:]
    log = second.output
    assert f"resumed from {step_dir(os.path.abspath(out), 4)} (step 4" in log, log[-4000:]
    assert "Traceback" not in log, log[-4000:]
    assert "SIGINT received: finishing this step" in log
    assert f"step 6 is saved in {step_dir(os.path.abspath(out), 6)}" in log
    assert "npu-rl: rollout pool closed (async/dropped_samples_at_exit=" in log
    assert latest_step(out) == 6 and saved_steps(out) == [1, 2, 3, 4, 5, 6]
    assert not os.path.exists(os.path.join(out, "global_step_5.tmp"))
    assert_nothing_left(tag, "after Ctrl-C")

    # 3. the same command again: resumes from step 6 and finishes
    third = Run(FULLY_ASYNC, argv, str(tmp_path / "third.log"), tag)
    assert third.wait() == 0, third.output[-4000:]
    assert f"resumed from {step_dir(os.path.abspath(out), 6)} (step 6" in third.output
    assert latest_step(out) == 8
    assert_nothing_left(tag, "after the run finished")

    rows = step_rows(out)  # one metrics file: a resumed run continues the log of the run it resumes
    assert sorted(rows) == list(range(1, 9))
    states = {step: trainer_state(out, step) for step in (4, 6, 8)}
    max_lag = math.ceil(0.5)
    for step, row in rows.items():
        assert row["async/staleness/max"] <= max_lag, (step, row["async/staleness/max"])
        assert math.isfinite(row["actor/pg_loss"]) and row["response_length/mean"] > 0
        if step % 2 == 0:
            assert row["weight_sync/version"] == step  # a push every trigger_parameter_sync_step=2 updates
    assert rows[1]["weight_sync/version"] == 0 and "weight_sync/version" not in rows[3]
    for resumed_at in (4, 6):  # the first step after a resume: the pool first takes the loaded weights
        row = rows[resumed_at + 1]
        assert row["weight_sync/version"] == resumed_at
        assert row["async/staleness/hist_0"] == 1.0  # generated under them: the old queue is not trained on
        assert row["async/resume_dropped_samples"] == states[resumed_at]["rollouts"]["queued_prompts"]
    assert all("async/resume_dropped_samples" not in rows[s] for s in (1, 2, 3, 4, 6, 8))
    for key in ("async/dropped_samples", "fully_async/count/stale_trajectory_processed"):  # totals carry over
        totals = [rows[s][key] for s in sorted(rows)]
        assert totals == sorted(totals), (key, totals)
    assert rows[5]["fully_async/count/stale_trajectory_processed"] >= \
        states[4]["rollouts"]["counts"].get("stale_trajectories", 0)

    # the version accounting: every update counted once, each version pushed once (a resume's re-send is not new)
    assert states[8]["rollouts"]["updates"] == 8 and states[8]["rollouts"]["pushed"] == [0, 2, 4, 6, 8]
    assert states[4]["rollouts"]["pushed"] == [0, 2, 4] and states[6]["rollouts"]["pushed"] == [0, 2, 4, 6]
    # the prompt stream: what it handed out was trained on (2 per update), dropped as stale, or was in the queue
    # at a checkpoint (dropped, counted, on the resume from it); nothing is generated twice or skipped uncounted
    dropped_at_resumes = 0
    for step in (4, 6, 8):
        r = states[step]["rollouts"]
        stale_prompts = r["counts"].get("dropped_samples", 0) // N
        assert consumed_prompts(r["prompts"]) == 2 * step + stale_prompts + r["queued_prompts"] + dropped_at_resumes
        dropped_at_resumes += r["queued_prompts"]


def test_one_step_off_sigterm_saves_drains_and_resumes(tiny_model_dir, tmp_path, reward):
    out = str(tmp_path / "run")
    argv = [o for o in async_overrides(tiny_model_dir, out, reward) if not o.startswith("trainer.resume_mode=")] + [
        "preset=grpo", "trainer.total_training_steps=3", "trainer.test_freq=0", "trainer.save_freq=0",
        "trainer.val_before_train=False", "trainer.resume_mode=auto", "ray_kwargs.ray_init.num_cpus=4"]
    tag = uuid.uuid4().hex
    rows_per_step = 4 * N
    # SIGTERM to the driver alone (kill PID) in step 2's reward phase, while the pool generates step 3's batch
    first = Run(ONE_STEP_OFF, argv, str(tmp_path / "first.log"), tag, FAULT_COUNTER=str(tmp_path / "calls"),
                FAULT_SIGNAL_AT=str(rows_per_step + 3), FAULT_SIGNAL="SIGTERM")
    assert first.wait() == 143, first.output[-4000:]
    log = first.output
    assert "Traceback" not in log, log[-4000:]
    assert f"saved step 2 to {step_dir(os.path.abspath(out), 2)}" in log  # trainer.save_on_interrupt
    assert "npu-rl: rollout pool closed (async/dropped_samples_at_exit=4)" in log  # step 3's batch, finished
    assert latest_step(out) == 2 and saved_steps(out) == [2]
    assert trainer_state(out, 2)["rollouts"] == {"updates": 2, "in_flight_prompts": 4}
    assert_nothing_left(tag, "after SIGTERM")

    second = Run(ONE_STEP_OFF, argv, str(tmp_path / "second.log"), tag)
    assert second.wait() == 0, second.output[-4000:]
    assert f"resumed from {step_dir(os.path.abspath(out), 2)} (step 2" in second.output
    rows = step_rows(out)
    assert sorted(rows) == [1, 2, 3] and latest_step(out) == 2  # save_freq=0: saved only on the interrupt
    assert rows[2]["async/staleness/hist_1"] == 1.0 and rows[2]["weight_sync/version"] == 1
    assert rows[3]["weight_sync/version"] == 2  # the loaded weights to the pool before it generates
    assert rows[3]["async/staleness/hist_0"] == 1.0 and rows[3]["async/resume_dropped_samples"] == 4.0
    assert_nothing_left(tag, "after the resumed run")


def test_one_step_off_second_ctrl_c_exits_130_in_words(tiny_model_dir, tmp_path, reward):
    out = str(tmp_path / "run")
    argv = [o for o in async_overrides(tiny_model_dir, out, reward) if not o.startswith("trainer.resume_mode=")] + [
        "preset=grpo", "trainer.total_training_steps=3", "trainer.test_freq=0", "trainer.save_freq=1",
        "trainer.val_before_train=False", "trainer.resume_mode=auto", "ray_kwargs.ray_init.num_cpus=4"]
    tag = uuid.uuid4().hex
    rows_per_step = 4 * N
    # Ctrl-C twice to the process group (a terminal's) in step 2's reward phase: the second abandons the step
    run = Run(ONE_STEP_OFF, argv, str(tmp_path / "run.log"), tag, FAULT_COUNTER=str(tmp_path / "calls"),
              FAULT_SIGNAL_AT=f"{rows_per_step + 2},{rows_per_step + 4}", FAULT_SIGNAL="SIGINT",
              FAULT_SIGNAL_GROUP="1")
    assert run.wait() == 130, run.output[-4000:]
    log = run.output
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-4000:]
    assert "npu-rl: SIGINT again: stopping now, the step in progress is lost" in log
    assert log.rstrip().splitlines()[-1] == "npu-rl: interrupted", log[-2000:]
    assert saved_steps(out) == [1] and latest_step(out) == 1  # step 2 abandoned; step 1 whole
    verify_step(step_dir(out, 1))
    assert_nothing_left(tag, "after a second Ctrl-C")
