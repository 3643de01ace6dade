"""Masked statistics and loss_agg_mode, against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from npu_rl.core import LOSS_AGG_MODES, agg_loss, check_loss_agg_mode, loss_denominators
from npu_rl.core.aggregation import masked_mean, masked_sum, masked_var, masked_whiten

# Two sequences of width 3: row 0 has tokens 0, 1 valid; row 1 only token 0; row 2 nothing.
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])


def test_modes_are_verls_five():
    assert LOSS_AGG_MODES == (
        "token-mean",
        "token-sum",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
    )


def test_masked_mean_sum_and_nan_outside_the_mask():
    values = LOSS.clone()
    values[0, 2] = float("nan")  # outside the mask: must not leak
    # (1 + 2 + 4) / 3 valid tokens
    assert_close(masked_mean(values, MASK), torch.tensor(7.0 / 3.0))
    assert_close(masked_sum(values, MASK), torch.tensor(7.0))
    # per row: (1 + 2) / 2, 4 / 1, empty row -> 0
    assert_close(masked_mean(values, MASK, dim=-1), torch.tensor([1.5, 4.0, 0.0]))


def test_masked_var_is_unbiased_and_safe_for_one_entry():
    values = torch.tensor([1.0, 2.0, 3.0, 4.0])
    # mean 2.5; squares 2.25 + 0.25 + 0.25 + 2.25 = 5; unbiased 5 / 3, population 5 / 4
    assert_close(masked_var(values, torch.ones(4)), torch.tensor(5.0 / 3.0))
    assert_close(masked_var(values, torch.ones(4), unbiased=False), torch.tensor(1.25))
    one = torch.tensor([1, 0, 0, 0])
    assert_close(masked_var(values, one), torch.tensor(0.0))
    # one valid entry: variance 0, so the valid entry whitens to (1 - 1) / sqrt(0 + 1e-8) = 0, not NaN
    assert_close(masked_whiten(values, one)[0], torch.tensor(0.0))


def test_masked_whiten_by_hand():
    values = torch.tensor([1.0, 3.0, 100.0])
    mask = torch.tensor([1, 1, 0])
    # mean 2, unbiased var ((-1)^2 + 1^2) / 1 = 2 -> (x - 2) / sqrt(2 + 1e-8)
    expected = (values - 2.0) / math.sqrt(2.0 + 1e-8)
    assert_close(masked_whiten(values, mask), expected)
    assert_close(masked_whiten(values, mask, shift_mean=False), expected + 2.0)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7.0 / 3.0),  # (1 + 2 + 4) / 3 tokens
        ("token-sum", 7.0),  # 1 + 2 + 4, no denominator
        ("seq-mean-token-sum", 3.5),  # ((1 + 2) + 4) / 2 sequences (the empty row does not count)
        ("seq-mean-token-mean", 2.75),  # ((1 + 2) / 2 + 4 / 1) / 2
        ("seq-mean-token-sum-norm", 3.5 / 3.0),  # seq-mean-token-sum / T, T = 3
    ],
)
def test_agg_loss_local_denominators(mode, expected):
    assert_close(agg_loss(loss_mat=LOSS, loss_mask=MASK, loss_agg_mode=mode), torch.tensor(expected))


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7.0 / 6.0),  # numerator 7 over a global 6 tokens
        ("token-sum", 7.0),  # denominators do not apply
        ("seq-mean-token-sum", 7.0 / 4.0),  # 7 over a global 4 sequences
        ("seq-mean-token-mean", 5.5 / 4.0),  # (1.5 + 4) / 4
        ("seq-mean-token-sum-norm", 7.0 / 4.0 / 7.0),  # loss_scale_factor 7
    ],
)
@pytest.mark.parametrize("as_tensor", [False, True])
def test_agg_loss_global_denominators(mode, expected, as_tensor):
    def wrap(x):
        return torch.tensor(x) if as_tensor else x

    loss = agg_loss(
        loss_mat=LOSS,
        loss_mask=MASK,
        loss_agg_mode=mode,
        global_num_tokens=wrap(6),
        global_num_seqs=wrap(4),
        loss_scale_factor=wrap(7.0),
    )
    assert_close(loss, torch.tensor(expected))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("denominator", [None, 0, torch.tensor(0)])
def test_all_masked_gives_zero_not_nan(mode, denominator):
    loss = agg_loss(
        loss_mat=LOSS,
        loss_mask=torch.zeros_like(MASK),
        loss_agg_mode=mode,
        global_num_tokens=denominator,
        global_num_seqs=denominator,
    )
    assert_close(loss, torch.tensor(0.0))


def test_loss_denominators():
    counts = loss_denominators(MASK)
    assert_close(counts["global_num_tokens"], torch.tensor(3))
    assert_close(counts["global_num_seqs"], torch.tensor(2))


def test_unknown_mode_lists_known():
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        check_loss_agg_mode("seq-mean")
    with pytest.raises(ValueError, match="token-mean"):
        agg_loss(loss_mat=LOSS, loss_mask=MASK, loss_agg_mode="token-max")
