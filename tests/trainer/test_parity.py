"""``npu-rl doctor --parity``: the statistics by hand, the recommendation's three cases, and a run on the tiny model."""

from __future__ import annotations

import pytest
import torch

from npu_rl.commands.parity import gap_stats, recommend

ROLLOUT = torch.full((2, 4), -2.0)
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
IDS = torch.tensor([[10, 11, 12, 0], [20, 21, 0, 0]])


def test_gap_statistics_by_hand():
    # actor - rollout = [0.1, -0.3, 0.0 | 1.0, 0.2], padding ignored (its 5.0 must not count)
    actor = ROLLOUT + torch.tensor([[0.1, -0.3, 0.0, 5.0], [1.0, 0.2, 0.0, 0.0]])
    s = gap_stats(actor, ROLLOUT, MASK, IDS, top=2)
    assert (s.tokens, s.sequences) == (5, 2)
    assert s.mean_abs == pytest.approx((0.1 + 0.3 + 0.0 + 1.0 + 0.2) / 5, abs=1e-6)
    assert s.mean_signed == pytest.approx((0.1 - 0.3 + 1.0 + 0.2) / 5, abs=1e-6)
    assert s.max == pytest.approx(1.0, abs=1e-6)
    # p99 of [0, 0.1, 0.2, 0.3, 1.0] (linear interpolation): 0.3 + 0.96 * (1.0 - 0.3)
    assert s.p99 == pytest.approx(0.3 + 0.96 * 0.7, abs=1e-6)
    assert s.seq_max_abs_mean == pytest.approx(0.6, abs=1e-6)  # row 1: (1.0 + 0.2) / 2
    assert [(r, p, t) for r, p, t, _, _ in s.largest] == [(1, 0, 20), (0, 1, 11)]
    shares = {label.split(" (")[0]: (token, seq) for label, token, seq in s.corrections}
    # e^1 = 2.72 > 2: one token of five truncated by token TIS, in one sequence of two
    assert shares["token TIS at 2.0"] == pytest.approx((0.2, 0.5))
    # sequence ratios e^-0.2 and e^1.2 = 3.3 > 2: one sequence of two, its 2 tokens of 5
    assert shares["sequence TIS at 2.0"] == pytest.approx((0.4, 0.5))
    assert shares["token rejection token_k1 at 2.0"] == pytest.approx((0.2, 0.5))


def test_recommendations():
    small = gap_stats(ROLLOUT + 0.001, ROLLOUT, MASK, IDS)
    assert "no correction needed" in recommend(small)
    real = gap_stats(ROLLOUT + torch.tensor([[0.3, 0, 0, 0], [0, 0, 0, 0]]), ROLLOUT, MASK, IDS)
    assert "safety net" in recommend(real)
    large = gap_stats(ROLLOUT + torch.tensor([[1.5, 0, 0, 0], [0, 0, 0, 0]]), ROLLOUT, MASK, IDS)
    assert "gap is large" in recommend(large) and "seq_mean_k1" in recommend(large)


def test_no_tokens_is_an_error():
    with pytest.raises(ValueError, match="no response tokens"):
        gap_stats(ROLLOUT, ROLLOUT, torch.zeros_like(MASK), IDS)


def test_doctor_parity_on_the_tiny_model_with_hf(tiny_model_dir, capsys):
    from npu_rl.cli import main

    code = main(["doctor", "--parity", tiny_model_dir, "--prompts", "2", "--top", "3",
                 "actor_rollout_ref.rollout.name=hf", "data.max_response_length=6",
                 "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32"])
    out = capsys.readouterr().out
    assert code == 0
    assert "engine hf" in out and "per-token gap" in out and out.count("  response ") == 3
    assert "token TIS at 2.0" in out and "recommendation: " in out
