"""The Python API's reward callables (``npu_rl.api``, issue 39): a function at the top level goes by reference; any
other callable that pickles (a partial, a callable object, a bound method, a lambda, a function defined inside a
function) is pickled when the Trainer is made, written under the output folder and scored from that file; one that
does not pickle is refused there, named, with the reason."""

from __future__ import annotations

import functools
import os
import threading

import pytest

from npu_rl.api import PickledReward, Trainer, reward_reference, write_pickled
from npu_rl.reward import combined
from npu_rl.reward.combined import compute_score
from tests.trainer.conftest import TRAIN


def _score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
    return scale * solution_str.count("7")


class _Scorer:
    def __init__(self, bonus: float):
        self.bonus = bonus

    def __call__(self, data_source, solution_str, ground_truth, extra_info=None):
        return self.bonus + float(solution_str == ground_truth)

    def method(self, data_source, solution_str, ground_truth, extra_info=None):
        return -self.bonus


def _make_local(offset: float):
    def local(data_source, solution_str, ground_truth, extra_info=None):
        return offset + len(solution_str)
    return local


def scored_from_file(reward: PickledReward, tmp_path, index: int = 0) -> float:
    """What the scoring processes do: read the written file (not the object this process holds) and call it."""
    ref = write_pickled(reward, str(tmp_path), index)
    combined._LOADED.pop(ref, None)
    return compute_score("d", "777", "777", reward_funcs=[ref])["score"]


@pytest.mark.parametrize("fn, label, score", [
    (functools.partial(_score, scale=2.0), "partial(_score)", 6.0),
    (_Scorer(0.5), "_Scorer object", 1.5),
    (_Scorer(0.25).method, "_Scorer.method", -0.25),
    (_make_local(10.0), "_make_local.<locals>.local", 13.0),
    (lambda data_source, solution_str, ground_truth, extra_info=None: 4.0, "<lambda>", 4.0),
])
def test_a_callable_that_pickles_is_accepted_and_scored_from_its_file(fn, label, score, tmp_path):
    reward = reward_reference(fn)
    assert isinstance(reward, PickledReward) and reward.label.endswith(label)
    assert scored_from_file(reward, tmp_path) == score


def test_a_top_level_function_still_goes_by_reference():
    assert reward_reference(_score) == f"{__name__}:_score"


def test_a_callable_that_does_not_pickle_is_refused_naming_it_and_why():
    lock = threading.Lock()

    def holds_a_lock(data_source, solution_str, ground_truth, extra_info=None):
        with lock:
            return 0.0

    with pytest.raises(TypeError, match=r"reward function '\S*holds_a_lock' cannot be passed to the processes that "
                                        r"score: .* pickling it failed: TypeError: cannot pickle '_thread.lock'"):
        reward_reference(holds_a_lock)
    with pytest.raises(TypeError, match=r"reward function '_Scorer object' .*cannot pickle '_thread.lock'"):
        reward_reference(_Scorer(lock))


def test_the_trainer_writes_a_pickled_reward_under_its_output_folder(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    trainer = Trainer(model=tiny_model_dir, reward_funcs=[functools.partial(_score, scale=3.0), _score],
                      train_dataset=TRAIN, output_dir=str(out))
    pickled, named = trainer.reward_refs
    assert pickled == str(out / "reward_funcs" / "0-partial(_score).pkl") and os.path.isfile(pickled)
    assert named == f"{__name__}:_score"
    assert trainer.config.custom_reward_function.reward_kwargs["reward_funcs"] == [pickled, named]
    combined._LOADED.pop(pickled, None)
    assert compute_score("d", "77", "", reward_funcs=[pickled, named]) == {"score": 8.0, "partial(_score)": 6.0,
                                                                          "_score": 2.0}
