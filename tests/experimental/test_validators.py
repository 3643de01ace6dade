"""Validation on the rollout pool sees the trainer's weights: before the first push (and after a resume) the pool
holds the model folder's weights, or none at all (vLLM's load_format=dummy), so the trainer pushes first."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from npu_rl.trainer.async_rollouts import OneStepOffRollouts, RolloutPool, _PausedValidator


class FakeRolloutRanks:
    def __init__(self, log):
        self.log = log

    def generate_sequences(self, prompts, validate=False):
        self.log.append(("generate", validate))
        return "out"


def fake_pool(log):
    pool = RolloutPool.__new__(RolloutPool)
    pool.group = SimpleNamespace(rollout=FakeRolloutRanks(log))
    pool.pushed_version, pool.pushed = -1, []

    def push(version):
        log.append(("push", version))
        pool.pushed_version = version
        pool.pushed.append(version)
        return {}
    pool.push = push
    return pool


def test_one_step_off_validation_pushes_the_trainer_weights_first():
    log: list = []
    rollouts = OneStepOffRollouts(fake_pool(log), prompts=None)
    assert rollouts.validator.generate_sequences("p", validate=True) == "out"
    assert log == [("push", 0), ("generate", True)]
    rollouts.validator.generate_sequences("p", validate=True)  # already holds version 0: no second push
    assert log[2:] == [("generate", True)]
    rollouts.load_state_dict({"updates": 7})  # a resume: the pool holds the folder's weights again
    log.clear()
    rollouts.validator.generate_sequences("p", validate=True)
    assert log == [("push", 7), ("generate", True)]


def test_fully_async_validation_pushes_the_trainer_weights_first():
    log: list = []
    rollouts = SimpleNamespace(pool=fake_pool(log), updates=3, cond=threading.Condition(), pausing=False,
                               _pause=lambda: log.append(("pause",)))
    assert _PausedValidator(rollouts).generate_sequences("p", validate=True) == "out"
    assert log == [("pause",), ("push", 3), ("generate", True)]
    log.clear()
    _PausedValidator(rollouts).generate_sequences("p", validate=True)
    assert log == [("pause",), ("generate", True)] and rollouts.pausing is False
