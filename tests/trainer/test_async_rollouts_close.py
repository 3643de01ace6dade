"""The asynchronous trainers' rollout pool is stopped on the way out even when the batch it was generating fails
(a rollout rank lost mid-batch): the other ranks and the pool's devices are not left behind."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from npu_rl.trainer.async_rollouts import OneStepOffRollouts, RolloutPool


class FailingPending:
    def get(self):
        raise RuntimeError("a Ray worker died while running rollout.generate_ahead (injected)")


class FinishedPending:
    def get(self):
        return None


def _pool(log: list) -> RolloutPool:
    return RolloutPool(SimpleNamespace(shutdown=lambda: log.append("shutdown")), actor_rollout=None)


def test_one_step_off_close_stops_the_pool_when_the_batch_in_flight_fails():
    log: list = []
    rollouts = OneStepOffRollouts(_pool(log), prompts=None)
    rollouts.pending = (["p0", "p1"], FailingPending())
    with pytest.raises(RuntimeError, match="worker died"):
        rollouts.close()
    assert log == ["shutdown"] and rollouts.pending is None


def test_one_step_off_close_counts_the_batch_it_waited_for():
    log: list = []
    rollouts = OneStepOffRollouts(_pool(log), prompts=None)
    rollouts.pending = (["p0", "p1", "p2"], FinishedPending())
    assert rollouts.close() == {"async/dropped_samples_at_exit": 3.0}
    assert log == ["shutdown"]
