"""A stored trace of the numbers: 3 GRPO steps of the tiny model on CPU with a fixed seed, its losses, advantages,
rewards and gradient norms compared step by step with tests/e2e/traces/grpo_tiny_cpu.json (as torchtune's recipe
tests and torchtitan's loss files do). A change to a loss, an estimator, the sampling or the update shows here as a
changed number, not only as a run that still finishes.

Tolerance: relative 1e-4 (absolute 1e-6): on one machine and one torch version the run is bit-for-bit repeatable
(one thread, fixed seeds); the margin only absorbs the order of float sums across CPU instruction sets. The trace
records the torch version it was made with; with another one the test skips, saying so.

Regenerate after an intended change (and say why in the commit):

    NPU_RL_UPDATE_TRACE=1 .venv/bin/python -m pytest -q tests/e2e/test_trace.py
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from tests.trainer.conftest import base_overrides, reward_file, run_training, step_rows  # noqa: F401 (fixture)

TRACE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "traces", "grpo_tiny_cpu.json")
STEPS = 3
KEYS = (
    "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/ppo_kl", "actor/pg_clipfrac", "actor/grad_norm",
    "critic/score/mean", "critic/rewards/mean", "critic/advantages/mean", "critic/advantages/max",
    "critic/advantages/min", "critic/returns/mean", "response_length/mean",
)
RTOL, ATOL = 1e-4, 1e-6


def _trace(tiny_model_dir: str, reward: str, out_dir: str) -> dict:
    overrides = base_overrides(tiny_model_dir, out_dir, reward) + [
        "preset=grpo", f"trainer.total_training_steps={STEPS}", "trainer.save_freq=-1", "trainer.test_freq=-1",
        "trainer.val_before_train=False"]
    assert run_training(overrides) == 0
    rows = step_rows(out_dir)
    assert sorted(rows) == list(range(1, STEPS + 1))
    return {"torch": torch.__version__.split("+")[0],
            "steps": {str(step): {key: rows[step][key] for key in KEYS if key in rows[step]} for step in sorted(rows)}}


def test_grpo_steps_match_the_stored_trace(tiny_model_dir, reward_file, tmp_path):  # noqa: F811
    got = _trace(tiny_model_dir, reward_file, str(tmp_path / "run"))
    if os.environ.get("NPU_RL_UPDATE_TRACE") == "1":
        with open(TRACE, "w") as f:
            json.dump(got, f, indent=1, sort_keys=True)
            f.write("\n")
        pytest.skip(f"trace written to {TRACE}")
    with open(TRACE) as f:
        want = json.load(f)
    if want["torch"] != got["torch"]:
        pytest.skip(f"the trace was made with torch {want['torch']}, this is {got['torch']}: regenerate it "
                    "(NPU_RL_UPDATE_TRACE=1) on this torch to compare")
    assert set(got["steps"]) == set(want["steps"])
    for step, expected in want["steps"].items():
        assert set(got["steps"][step]) == set(expected), f"step {step}: metrics differ"
        for key, value in expected.items():
            actual = got["steps"][step][key]
            assert math.isclose(actual, value, rel_tol=RTOL, abs_tol=ATOL), (
                f"step {step} {key}: {actual!r}, the trace has {value!r} (NPU_RL_UPDATE_TRACE=1 regenerates it "
                "after an intended change)")
