"""A hung or crashing reward: one deadline per batch, hung work killed at once, every row that did not score counted.

On the code before this module a strict run waited ``timeout_s`` for every remaining row before raising for the
first one, and a tolerant run paid ``timeout_s`` per hung row with no bound on the batch.
"""

from __future__ import annotations

import os
import re
import textwrap
import time

import pytest

from npu_rl.config.reward_schema import RewardModelConfig
from npu_rl.reward import build_reward_manager
from npu_rl.reward.managers import TimeoutScoringError
from npu_rl.reward.score_fn import RewardFunctionError
from npu_rl.utils.deadline import AlarmTimeout, Deadline, alarm
from tests.helpers import make_tiny_tokenizer
from tests.reward.common import config, make_batch

FUNCTIONS = textwrap.dedent('''
    import os
    import signal
    import time


    def sleeps(data_source, solution_str, ground_truth, extra_info=None):
        time.sleep(1000)
        return 1.0


    def sleeps_and_records_pid(data_source, solution_str, ground_truth, extra_info=None):
        with open(os.environ["PID_FILE"], "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(1000)
        return 1.0


    def crashes_on_b(data_source, solution_str, ground_truth, extra_info=None):
        if "b" in solution_str:
            os.kill(os.getpid(), signal.SIGKILL)  # os._exit is caught now (test_reward_exits.py); this is not
        time.sleep(1000)
        return 1.0
''')


@pytest.fixture(scope="module")
def tok():
    return make_tiny_tokenizer()


@pytest.fixture
def fns(tmp_path):
    path = tmp_path / "slow_rewards.py"
    path.write_text(FUNCTIONS)
    return str(path)


def _batch(tok, n):
    return make_batch(tok, ["a"] * n, ["1"] * n)


def test_defaults_are_bounded():
    cfg = RewardModelConfig()
    assert 0 < cfg.timeout_s <= 10 and 0 < cfg.batch_timeout_s <= 300


def test_sleep_1000_with_default_settings_stops_at_the_first_deadline(tok, fns):
    manager = build_reward_manager(config(path=fns, name="sleeps"), tok)  # defaults: in-process, 10 s per call
    start = time.monotonic()
    with pytest.raises(TimeoutScoringError) as info:
        manager(_batch(tok, 16))
    elapsed = time.monotonic() - start
    assert elapsed < RewardModelConfig().timeout_s + 5, elapsed  # before: 16 x 30 s
    text = str(info.value)
    assert "row 0 of the batch" in text and "1 of 16 rows timed out" in text and "15 not scored" in text


@pytest.mark.parametrize("num_workers", [0, 2])
def test_strict_stops_at_the_first_timeout_and_counts_every_row(tok, fns, num_workers):
    manager = build_reward_manager(config(path=fns, name="sleeps", num_workers=num_workers, timeout_s=0.5), tok)
    try:
        manager(_batch(tok, 1))  # warm the pool up (starting workers is not part of what is timed)
    except TimeoutScoringError:
        pass
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutScoringError) as info:
            manager(_batch(tok, 16))
        elapsed = time.monotonic() - start
    finally:
        manager.close()
    assert elapsed < 3.0, elapsed  # one limit (0.5 s), not 16 (in-process: 8 s) or 8 (two workers: 4 s) of them
    # the busy workers' rows time out together, or the later-started ones are killed in flight (not scored)
    timed_out = int(re.search(r"(\d+) of 16 rows timed out", str(info.value)).group(1))
    assert 1 <= timed_out <= max(1, num_workers)
    assert f"0 failed, {16 - timed_out} not scored" in str(info.value)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_tolerant_batch_has_one_deadline_and_counts_every_row(tok, fns, num_workers):
    cfg = config(path=fns, name="sleeps", num_workers=num_workers, timeout_s=0.4, batch_timeout_s=1.0,
                 tolerate_errors=True)
    manager = build_reward_manager(cfg, tok)
    try:
        manager(_batch(tok, 1))  # warm-up
        start = time.monotonic()
        result = manager(_batch(tok, 20))
        elapsed = time.monotonic() - start
    finally:
        manager.close()
    assert elapsed < 2.5, elapsed  # 20 x 0.4 s in-process, 10 x 0.4 s with two workers, before
    assert result.metrics["reward/timeouts"] == 20.0 and result.metrics["reward/errors"] == 0.0
    assert result.token_level_scores.abs().sum() == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_a_strict_stop_kills_the_hung_workers(tok, fns, tmp_path, monkeypatch):
    pid_file = tmp_path / "pids"
    monkeypatch.setenv("PID_FILE", str(pid_file))
    manager = build_reward_manager(config(path=fns, name="sleeps_and_records_pid", num_workers=3, timeout_s=0.5), tok)
    try:
        with pytest.raises(TimeoutScoringError):
            manager(_batch(tok, 6))
        pids = [int(p) for p in pid_file.read_text().split()]
        assert 1 <= len(pids) <= 3 and manager.runner._workers == []  # every busy worker was dropped
        time.sleep(0.2)
        assert not any(_alive(p) for p in pids), pids  # killed at the stop, not left sleeping
    finally:
        manager.close()


def test_a_crash_stops_the_batch_at_once_naming_the_row(tok, fns):
    batch = make_batch(tok, ["a", "b", "a", "a"], ["1"] * 4)
    manager = build_reward_manager(config(path=fns, name="crashes_on_b", num_workers=2, timeout_s=30), tok)
    try:
        start = time.monotonic()
        with pytest.raises(RewardFunctionError) as info:
            manager(batch)
        elapsed = time.monotonic() - start
    finally:
        manager.close()
    assert elapsed < 10, elapsed  # not waiting for row 0's 30 s limit
    text = str(info.value)
    assert "row 1 of the batch" in text and "exit code -9" in text and "1 failed" in text


def test_deadline_caps_each_call_and_alarm_restores_an_outer_alarm():
    deadline = Deadline(0.2)
    assert deadline.cap(10.0) <= 0.2 and deadline.cap(None) <= 0.2 and not deadline.expired
    assert Deadline(None).cap(3.0) == 3.0
    start = time.monotonic()
    with pytest.raises(AlarmTimeout):
        with alarm(deadline.cap(10.0)):
            time.sleep(5)
    assert time.monotonic() - start < 1.0 and deadline.expired
    with pytest.raises(AlarmTimeout):  # the outer alarm still fires after an inner one finished
        with alarm(0.3):
            with alarm(0.05):
                pass
            time.sleep(2)
