"""``npu_rl.trainer.run.train`` stops every worker group it started, whatever fails after the first one starts (a
role's ``init_model``, a pool's start, the rollouts, the trainer), and the run fails with that error, not with one
raised while stopping. Fake groups stand in for the Ray ones (no Ray, no model loaded); the config, data, tokenizer
and reward managers are the real ones on the tiny model."""

from __future__ import annotations

import pytest

from npu_rl.config.loader import load_config
from npu_rl.trainer import run

from tests.trainer.conftest import base_overrides


class FakeRole:
    def __init__(self, name: str, log: list, fail: str | None):
        self.name, self.log, self.fail = name, log, fail

    def init_model(self, *args) -> None:
        if self.fail == f"{self.name}.init_model":
            raise RuntimeError(f"{self.name}: model folder not found (injected)")
        self.log.append(f"{self.name}.init_model")

    def model_config(self):
        return None


class FakeGroup:
    """A started worker group: its roles, and a record of its shutdown."""

    def __init__(self, label: str, roles: list[str], log: list, fail: str | None = None):
        self.label, self.log, self.fail = label, log, fail
        self.roles = {name: FakeRole(name, log, fail) for name in roles}

    def __getattr__(self, name: str):
        roles = self.__dict__.get("roles", {})
        if name in roles:
            return roles[name]
        raise AttributeError(name)

    def role_names(self) -> list[str]:
        return list(self.roles)

    def shutdown(self) -> None:
        self.log.append(f"{self.label}.shutdown")
        if self.fail == f"{self.label}.shutdown":
            raise RuntimeError(f"{self.label}: could not stop (injected)")


class FakeRollouts:
    def __init__(self, log: list):
        self.log = log

    def close(self) -> dict[str, float]:
        self.log.append("rollouts.close")
        return {}


class FakeTrainer:
    global_step, total_steps = 3, 3

    def __init__(self, *args, **kwargs):
        pass

    def fit(self) -> int:
        return 0


@pytest.fixture
def config(tmp_path, tiny_model_dir):
    overrides = ["preset=grpo", "trainer.val_before_train=False", "trainer.test_freq=0"]
    return load_config(base_overrides(tiny_model_dir, str(tmp_path / "out")) + overrides, "ppo_trainer")


def _fake_run(monkeypatch, log: list, fail: str | None, *, pool_starts: bool = True) -> None:
    """The trainer's group (actor_rollout) starts, then a reward model's pool group; ``fail`` names what raises."""
    monkeypatch.setattr(run, "build_worker_group", lambda *a: FakeGroup("trainer_group", ["actor_rollout"], log, fail))

    def build_pool_groups(*args):
        if not pool_starts:
            raise RuntimeError("reward pool: could not reserve [1] x {'CPU': 1} (injected)")
        group = FakeGroup("reward_pool", ["reward_model"], log, fail)
        return {"reward_model": group}

    def build_rollouts(*args):
        if fail == "build_rollouts":
            raise RuntimeError("rollout pool: join_weight_group timed out (injected)")
        return FakeRollouts(log)

    monkeypatch.setattr(run, "build_pool_groups", build_pool_groups)
    monkeypatch.setattr(run, "build_rollouts", build_rollouts)
    monkeypatch.setattr(run, "PPOTrainer", FakeTrainer)


@pytest.mark.parametrize("fail, message", [
    ("actor_rollout.init_model", "actor_rollout: model folder not found"),
    ("reward_model.init_model", "reward_model: model folder not found"),
    ("build_rollouts", "join_weight_group timed out"),
])
def test_a_failure_after_the_groups_started_stops_every_one(config, monkeypatch, fail, message):
    log: list = []
    _fake_run(monkeypatch, log, fail)
    with pytest.raises(RuntimeError, match=message):
        run.train(config)
    assert log.count("trainer_group.shutdown") == 1 and log.count("reward_pool.shutdown") == 1
    assert log.index("trainer_group.shutdown") < log.index("reward_pool.shutdown")  # start order
    if fail == "actor_rollout.init_model":  # the first model to load: nothing else was loaded
        assert not any(entry.endswith("init_model") for entry in log)


def test_a_pool_that_fails_to_start_stops_the_trainer_group(config, monkeypatch):
    log: list = []
    _fake_run(monkeypatch, log, None, pool_starts=False)
    with pytest.raises(RuntimeError, match="reward pool: could not reserve"):
        run.train(config)
    assert log == ["trainer_group.shutdown"]


def test_a_group_that_fails_to_stop_neither_hides_the_error_nor_keeps_the_others(config, monkeypatch, caplog):
    log: list = []
    _fake_run(monkeypatch, log, "actor_rollout.init_model")
    original = FakeGroup.shutdown

    def shutdown(self):
        original(self)
        if self.label == "trainer_group":
            raise RuntimeError("trainer_group: could not stop (injected)")

    monkeypatch.setattr(FakeGroup, "shutdown", shutdown)
    with pytest.raises(RuntimeError, match="actor_rollout: model folder not found"):
        run.train(config)
    assert log == ["trainer_group.shutdown", "reward_pool.shutdown"]
    assert "could not stop" in caplog.text  # logged, not raised over the error that stopped the run


def test_a_finished_run_stops_the_rollouts_then_each_group_once(config, monkeypatch):
    log: list = []
    _fake_run(monkeypatch, log, None)
    result = run.train(config)
    assert result.exit_code == 0 and result.global_step == 3
    assert log == ["actor_rollout.init_model", "reward_model.init_model", "rollouts.close",
                   "trainer_group.shutdown", "reward_pool.shutdown"]


def test_a_group_that_fails_to_stop_after_a_finished_run_fails_it(config, monkeypatch):
    log: list = []
    _fake_run(monkeypatch, log, "trainer_group.shutdown")
    with pytest.raises(RuntimeError, match="trainer_group: could not stop"):
        run.train(config)
    assert log[-2:] == ["trainer_group.shutdown", "reward_pool.shutdown"]  # the other group was still stopped


def test_close_groups_asks_every_group_and_raises_the_first_error():
    log: list = []
    groups = [FakeGroup("a", [], log, "a.shutdown"), FakeGroup("b", [], log), FakeGroup("c", [], log, "c.shutdown")]
    with pytest.raises(RuntimeError, match="a: could not stop"):
        run.close_groups(groups)
    assert log == ["a.shutdown", "b.shutdown", "c.shutdown"]


def test_distinct_keeps_the_first_seen_order_of_shared_groups():
    log: list = []
    a, b = FakeGroup("a", [], log), FakeGroup("b", [], log)
    assert run.distinct([b, a, b, a]) == [b, a]
