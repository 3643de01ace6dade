"""Clipped value loss and the entropy bonus, against numbers worked out by hand."""

from __future__ import annotations

import math

import torch
from torch.testing import assert_close

from npu_rl.core import entropy_bonus, entropy_from_logits, value_loss

# predicted [1, 2, 0], old [0.5, 0.5, 0.5], returns [1.5, 0, 1], cliprange 0.2 -> clipped predictions [0.7, 0.7, 0.3]
# t0: (1 - 1.5)^2 = 0.25 vs (0.7 - 1.5)^2 = 0.64 -> 0.64 (the clipped term wins)
# t1: (2 - 0)^2 = 4 vs (0.7 - 0)^2 = 0.49 -> 4
# t2: (0 - 1)^2 = 1 vs (0.3 - 1)^2 = 0.49 -> 1
# 0.5 * token-mean = 0.5 * (0.64 + 4 + 1) / 3 = 0.94
PREDICTED = torch.tensor([[1.0, 2.0, 0.0]])
OLD = torch.full((1, 3), 0.5)
RETURNS = torch.tensor([[1.5, 0.0, 1.0]])


def test_value_loss_by_hand():
    predicted = PREDICTED.clone().requires_grad_(True)
    out = value_loss(
        predicted_values=predicted, old_values=OLD, returns=RETURNS, response_mask=torch.ones(1, 3), cliprange_value=0.2
    )
    assert_close(out.loss, torch.tensor(0.94))
    assert_close(out.metrics["vf_clipfrac"], torch.tensor(1.0 / 3.0))
    (grad,) = torch.autograd.grad(out.loss, predicted)
    # t0: the clipped prediction is constant -> 0; t1: 0.5 * 2 (2 - 0) / 3; t2: 0.5 * 2 (0 - 1) / 3
    assert_close(grad, torch.tensor([[0.0, 2.0 / 3.0, -1.0 / 3.0]]))


def test_value_loss_masks_and_aggregates():
    mask = torch.tensor([[1, 1, 0]])
    out = value_loss(
        predicted_values=PREDICTED,
        old_values=OLD,
        returns=RETURNS,
        response_mask=mask,
        cliprange_value=0.2,
        loss_agg_mode="seq-mean-token-sum",
    )
    assert_close(out.loss, torch.tensor(0.5 * (0.64 + 4.0)))  # one sequence: token sum
    assert_close(out.metrics["vf_clipfrac"], torch.tensor(0.5))


def test_value_loss_gradcheck():
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    returns = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    predicted = (old + 0.5 * torch.randn(3, 4, generator=gen, dtype=torch.float64)).requires_grad_(True)
    mask = torch.ones(3, 4, dtype=torch.float64)
    mask[1, 3:] = 0

    def loss_of(values):
        return value_loss(
            predicted_values=values, old_values=old, returns=returns, response_mask=mask, cliprange_value=0.3
        ).loss

    assert torch.autograd.gradcheck(loss_of, (predicted,))


def test_entropy_from_logits_by_hand():
    # uniform over 4 -> log 4; probabilities [0.5, 0.5, ~0] -> log 2
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [5.0, 5.0, -1e4, -1e4]]])
    assert_close(entropy_from_logits(logits), torch.tensor([[math.log(4.0), math.log(2.0)]]))
    random = torch.randn(2, 3, 11)
    assert_close(entropy_from_logits(random), torch.distributions.Categorical(logits=random).entropy())
    assert entropy_from_logits(random.bfloat16()).dtype == torch.float32


def test_entropy_bonus_by_hand():
    entropy = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]])
    out = entropy_bonus(entropy=entropy, response_mask=mask, entropy_coeff=0.1)
    # token-mean (1 + 2 + 3) / 3 = 2; the term to add is -0.1 * 2
    assert_close(out.loss, torch.tensor(-0.2))
    assert_close(out.metrics["entropy"], torch.tensor(2.0))
    (grad,) = torch.autograd.grad(out.loss, entropy)
    assert_close(grad, torch.tensor([[-0.1 / 3, -0.1 / 3], [-0.1 / 3, 0.0]]))
