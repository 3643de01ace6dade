"""The RL math on a hand-built multi-turn batch: tool tokens get no advantage, no loss and no gradient; results
equal those of the same sequences with the tool tokens cut out (GAE skips the holes)."""

from __future__ import annotations

import torch

from npu_rl.core.advantages import AdvantageInputs, compute_advantages
from npu_rl.core.kl import kl_loss
from npu_rl.core.policy_loss import compute_policy_loss
from tests.core.policy_inputs import policy_inputs

# two conversations of 8 response positions: model(3) tool(2) model(2) pad(1) / model(5) pad(3)
MASK = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 0],
                     [1, 1, 1, 1, 1, 0, 0, 0]])
KEEP = MASK.bool()


def compact(x: torch.Tensor) -> torch.Tensor:
    """The model tokens of each row, left-aligned (what a single-turn batch of the same tokens would hold)."""
    out = torch.zeros_like(x)
    for i in range(x.shape[0]):
        row = x[i][KEEP[i]]
        out[i, : len(row)] = row
    return out


COMPACT_MASK = compact(MASK)


def scatter_back(x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    for i in range(x.shape[0]):
        n = int(KEEP[i].sum())
        out[i][KEEP[i]] = x[i, :n]
    return out


def test_gae_with_tool_holes_equals_gae_on_the_compacted_sequence():
    torch.manual_seed(0)
    rewards = torch.zeros(2, 8)
    rewards[0, 6], rewards[1, 4] = 1.0, -1.0  # the score on each row's last model token
    rewards[0, 3] = 5.0  # a reward on a tool token must be ignored
    values = torch.randn(2, 8)
    holes = compute_advantages(adv_estimator="gae", inputs=AdvantageInputs(
        rewards, MASK, values=values, gamma=0.9, lam=0.8))
    plain = compute_advantages(adv_estimator="gae", inputs=AdvantageInputs(
        compact(rewards * MASK), COMPACT_MASK, values=compact(values), gamma=0.9, lam=0.8))
    torch.testing.assert_close(holes.advantages, scatter_back(plain.advantages))
    torch.testing.assert_close(holes.returns, scatter_back(plain.returns))
    assert (holes.advantages[~KEEP] == 0).all() and (holes.returns[~KEEP] == 0).all()


def test_gae_by_hand_across_a_hole():
    # one row: model, tool, model; reward 1 on the last token; V = [0.5, 9, 0.25]; gamma = lam = 1, no whitening
    # skipping the tool token: A_2 = 1 - 0.25 = 0.75; A_0 = (0 + V_2 - V_0) + A_2 = (0.25 - 0.5) + 0.75 = 0.5
    rewards, values, mask = torch.tensor([[0.0, 3.0, 1.0]]), torch.tensor([[0.5, 9.0, 0.25]]), torch.tensor([[1, 0, 1]])
    out = compute_advantages(adv_estimator="gae", inputs=AdvantageInputs(rewards, mask, values=values))
    torch.testing.assert_close(out.returns, torch.tensor([[1.0, 0.0, 1.0]]))
    raw = out.returns - values * mask  # advantages before whitening
    torch.testing.assert_close(raw, torch.tensor([[0.5, 0.0, 0.75]]))


def test_grpo_advantages_are_zero_on_tool_tokens():
    rewards = torch.zeros(2, 8)
    rewards[0, 6], rewards[1, 4] = 1.0, 0.0
    out = compute_advantages(adv_estimator="grpo", inputs=AdvantageInputs(rewards, MASK, index=["g", "g"]))
    assert (out.advantages[~KEEP] == 0).all()
    assert (out.advantages[0][KEEP[0]] > 0).all() and (out.advantages[1][KEEP[1]] < 0).all()


def test_policy_and_kl_losses_ignore_tool_tokens():
    torch.manual_seed(1)
    old = torch.randn(2, 8)
    ref = torch.randn(2, 8)
    advantages = torch.randn(2, 8) * MASK
    logprobs = (old + 0.1 * torch.randn(2, 8)).requires_grad_(True)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        loss = compute_policy_loss(loss_mode="vanilla", inputs=policy_inputs(
            old, logprobs, advantages, MASK, loss_agg_mode=mode)).loss
        loss = loss + kl_loss(logprobs=logprobs, ref_logprobs=ref, response_mask=MASK, kl_loss_coef=0.5,
                              loss_agg_mode=mode).loss
        grad, = torch.autograd.grad(loss, logprobs)
        assert (grad[~KEEP] == 0).all() and (grad[KEEP] != 0).all()
        compact_logprobs = compact(logprobs.detach()).requires_grad_(True)
        plain = compute_policy_loss(loss_mode="vanilla", inputs=policy_inputs(
            compact(old), compact_logprobs, compact(advantages), COMPACT_MASK, loss_agg_mode=mode)).loss
        plain = plain + kl_loss(logprobs=compact_logprobs, ref_logprobs=compact(ref), response_mask=COMPACT_MASK,
                                kl_loss_coef=0.5, loss_agg_mode=mode).loss
        torch.testing.assert_close(loss, plain)
