"""With global denominators passed in, the gradient of a batch equals the sum of its micro-batches' gradients,
whatever the split (1, 2 or 4 ways), for every loss_agg_mode and every split-independent loss."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from npu_rl.core import (
    LOSS_AGG_MODES,
    compute_policy_loss,
    entropy_bonus,
    kl_loss,
    loss_denominators,
    value_loss,
)
from tests.core.policy_inputs import policy_inputs

BATCH, WIDTH = 8, 6
# clip_cov and kl_cov pick tokens by statistics of the micro-batch (as verl does), so they are split-dependent.
SPLIT_INDEPENDENT = ("vanilla", "gspo", "gpg", "geo_mean", "cispo", "sapo", "dro", "dppo_tv", "dppo_kl")


def make_batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 1, 3, 0, 5, 2, 6, 4])  # uneven, one all-masked row, one of length 1
    mask = (torch.arange(WIDTH) < lengths.unsqueeze(-1)).double()
    old = -torch.rand(BATCH, WIDTH, generator=gen, dtype=torch.float64) - 0.2
    new = old + 0.4 * torch.randn(BATCH, WIDTH, generator=gen, dtype=torch.float64)
    adv = torch.randn(BATCH, 1, generator=gen, dtype=torch.float64).expand(BATCH, WIDTH) * mask
    other = torch.randn(BATCH, WIDTH, generator=gen, dtype=torch.float64)
    return old, new, adv, mask, other


def gradient(loss_fn, params, splits, mask):
    """Sum over micro-batches of d(loss share)/d(params), with denominators counted over the whole batch."""
    params = params.clone().requires_grad_(True)
    denominators = loss_denominators(mask)
    total = torch.zeros(())
    for rows in torch.arange(BATCH).chunk(splits):
        total = total + loss_fn(params, rows, denominators)
    (grad,) = torch.autograd.grad(total, params)
    return grad, total.detach()


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", SPLIT_INDEPENDENT)
def test_policy_loss_gradient_is_split_invariant(name, mode):
    old, new, adv, mask, _ = make_batch()

    def loss_fn(logprobs, rows, denominators):
        inputs = policy_inputs(
            old_logprobs=old[rows],
            logprobs=logprobs[rows],
            advantages=adv[rows],
            response_mask=mask[rows],
            loss_agg_mode=mode,
            clip_ratio_high=0.28,
            dro_beta=0.1,
            **denominators,
        )
        return compute_policy_loss(loss_mode=name, inputs=inputs).loss

    whole_grad, whole_loss = gradient(loss_fn, new, 1, mask)
    assert whole_grad.abs().sum() > 0
    for splits in (2, 4):
        grad, loss = gradient(loss_fn, new, splits, mask)
        assert_close(grad, whole_grad)
        assert_close(loss, whole_loss)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_value_kl_and_entropy_terms_are_split_invariant(mode):
    old, new, _, mask, other = make_batch(1)
    returns, old_values = other, other.flip(0)

    def loss_fn(params, rows, denominators):
        agg = dict(loss_agg_mode=mode, **denominators)
        v = value_loss(
            predicted_values=params[rows],
            old_values=old_values[rows],
            returns=returns[rows],
            response_mask=mask[rows],
            cliprange_value=0.2,
            **agg,
        ).loss
        k = kl_loss(
            logprobs=params[rows],
            ref_logprobs=old[rows],
            response_mask=mask[rows],
            kl_loss_coef=0.5,
            kl_type="low_var_kl",
            **agg,
        ).loss
        e = entropy_bonus(entropy=params[rows].exp(), response_mask=mask[rows], entropy_coeff=0.01, **agg).loss
        return v + k + e

    whole_grad, _ = gradient(loss_fn, new, 1, mask)
    for splits in (2, 4):
        assert_close(gradient(loss_fn, new, splits, mask)[0], whole_grad)


def test_local_denominators_would_depend_on_the_split():
    """The control: without global denominators, token-mean over uneven micro-batches is NOT the batch's mean."""
    old, new, adv, mask, _ = make_batch()

    def loss_fn(logprobs, rows, denominators):
        inputs = policy_inputs(
            old_logprobs=old[rows], logprobs=logprobs[rows], advantages=adv[rows], response_mask=mask[rows]
        )
        return compute_policy_loss(loss_mode="vanilla", inputs=inputs).loss

    whole_grad, _ = gradient(loss_fn, new, 1, mask)
    assert not torch.allclose(gradient(loss_fn, new, 4, mask)[0], whole_grad)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_uneven_micro_batches_give_the_same_gradient(mode):
    """8 rows in micro-batches of 3 (3 + 3 + 2), as when the per-rank mini-batch is not a multiple of the micro-batch
    size (verl runs that; so does npu-rl): the gradient equals the whole batch's."""
    old, new, adv, mask, _ = make_batch(2)
    denominators = loss_denominators(mask)

    def total_grad(chunks):
        params = new.clone().requires_grad_(True)
        total = sum(
            compute_policy_loss(loss_mode="vanilla", inputs=policy_inputs(
                old_logprobs=old[rows], logprobs=params[rows], advantages=adv[rows], response_mask=mask[rows],
                loss_agg_mode=mode, loss_scale_factor=WIDTH, **denominators)).loss
            for rows in chunks)
        return torch.autograd.grad(total, params)[0]

    whole = total_grad([torch.arange(BATCH)])
    assert_close(total_grad(list(torch.arange(BATCH).split(3))), whole)
