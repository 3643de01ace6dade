"""GRPO on tiny random mixture-of-experts models through the trainer (hf rollouts): the reward rises, the router
metrics reach metrics.jsonl and the curves."""

from __future__ import annotations

from tests.models.moe_models import save_tiny_moe
from tests.trainer.conftest import base_overrides, reward_file, run_training, step_rows  # noqa: F401 (a fixture)

ROUTER_KEYS = ("actor/moe/tokens_per_expert_max", "actor/moe/tokens_per_expert_mean", "actor/moe/max_over_mean",
               "actor/moe/dead_expert_share")


def test_grpo_with_r3_replay_and_the_aux_loss_learns_and_logs_router_metrics(tmp_path, reward_file):
    folder = save_tiny_moe(str(tmp_path / "qwen3_moe"), "qwen3_moe")
    out = str(tmp_path / "run")
    code = run_training(base_overrides(folder, out, reward_file) + [
        "preset=grpo", "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.rollout.n=8", "trainer.total_training_steps=16", "trainer.val_before_train=False",
        "actor_rollout_ref.actor.router_replay.mode=R3", "actor_rollout_ref.rollout.enable_rollout_routing_replay=True",
        "+actor_rollout_ref.model.override_config.output_router_logits=True"])
    assert code == 0
    rows = [row for _, row in sorted(step_rows(out).items())]
    for key in ROUTER_KEYS + ("actor/moe/aux_loss", "actor/moe/routing_mismatch"):
        assert all(key in row for row in rows), key
    # the router's own choice against the replayed one: the same weights for the first mini-batch, moved after
    assert all(0 <= row["actor/moe/routing_mismatch"] < 1 for row in rows)
    scores = [row["critic/score/mean"] for row in rows]
    first, last = sum(scores[:4]) / 4, sum(scores[-4:]) / 4
    assert last > first + 0.15, scores

    from npu_rl.tracking.plot import plot_runs

    written = plot_runs([out], out_dir=str(tmp_path / "curves"))
    html = [p for p in written if p.endswith(".html")]
    assert html and "actor/moe/max_over_mean" in open(html[0]).read()


def test_grpo_on_deepseek_v3_with_r2_replay_logs_router_metrics(tmp_path, reward_file):
    folder = save_tiny_moe(str(tmp_path / "deepseek_v3"), "deepseek_v3")
    out = str(tmp_path / "run")
    code = run_training(base_overrides(folder, out, reward_file) + [
        "preset=grpo", "trainer.total_training_steps=2", "trainer.val_before_train=False",
        "actor_rollout_ref.actor.router_replay.mode=R2", "actor_rollout_ref.model.use_remove_padding=True"])
    assert code == 0
    rows = list(step_rows(out).values())
    assert len(rows) == 2 and all(key in row for row in rows for key in ROUTER_KEYS)
    assert all("actor/moe/aux_loss" not in row for row in rows)  # DeepSeek-V3 has no auxiliary loss
    assert all(0 <= row["actor/moe/routing_mismatch"] < 1 for row in rows)
