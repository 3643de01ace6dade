"""rollout.mode=async end to end in the trainer (tiny model, hf engine): agent loops generate, the step trains, the
agent metrics are logged, validation runs through the same path."""

from __future__ import annotations

from tests.trainer.conftest import base_overrides, read_metrics, reward_file, run_training, step_rows  # noqa: F401


def test_async_mode_trains_with_tool_agent(tiny_model_dir, tmp_path, reward_file):
    out = str(tmp_path / "run")
    overrides = base_overrides(tiny_model_dir, out, reward_file) + [
        "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2", "data.return_raw_chat=True",
        "algorithm.adv_estimator=grpo", "trainer.total_training_steps=2", "trainer.test_freq=2",
        "trainer.val_before_train=True", "trainer.logger=[file]"]
    assert run_training(overrides) == 0
    steps = step_rows(out)
    assert sorted(steps) == [1, 2]
    for row in steps.values():
        assert row["num_turns/mean"] == 2.0 and row["agent_loop/tool_call_rate"] == 0.0  # no tools configured
        assert "actor/pg_loss" in row and "agent_loop/response_length/turn_1/mean" in row
    assert any("val-core/arith/acc/mean@1" in r for r in read_metrics(out))
