"""Rollout correction against hand-computed values (arithmetic in the comments), and its split invariance."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from npu_rl.core import RolloutCorrectionSpec, compute_policy_loss, loss_denominators
from npu_rl.core.rollout_correction import offpolicy_metrics, parse_rs_thresholds, rollout_correction
from tests.core.policy_inputs import policy_inputs

# Two rows; pi_train / pi_rollout per token: row 0 = [3.0, 0.6, 1.0, pad], row 1 = [1.5, 4.0, pad, pad].
RATIOS = torch.tensor([[3.0, 0.6, 1.0, 1.0], [1.5, 4.0, 1.0, 1.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.float64)
ROLLOUT = torch.full((2, 4), -1.0, dtype=torch.float64)
OLD = ROLLOUT + RATIOS.log()


def run(**spec):
    return rollout_correction(OLD, ROLLOUT, MASK, RolloutCorrectionSpec(**spec))


def t(x):
    return torch.tensor(x, dtype=torch.float64)


def test_token_tis():
    out = run(rollout_is="token", rollout_is_threshold=2.0)
    # min(r, 2) on valid tokens, 0 on padding
    assert_close(out.weights, t([[2.0, 0.6, 1.0, 0.0], [1.5, 2.0, 0.0, 0.0]]))
    assert out.response_mask is MASK  # no rejection asked
    m = out.metrics
    assert_close(m["rollout_is_mean"], t(7.1 / 5))  # (2 + 0.6 + 1 + 1.5 + 2) / 5 valid tokens
    assert_close(m["rollout_is_max"], t(2.0))
    assert_close(m["rollout_is_min"], t(0.6))
    assert_close(m["rollout_is_ratio_fraction_high"], t(0.4))  # raw 3.0 and 4.0 exceed 2: 2 of 5
    assert_close(m["rollout_is_ratio_fraction_low"], t(0.0))  # none below 1/2
    # E[w^2] = (4 + 0.36 + 1 + 2.25 + 4) / 5 = 11.61 / 5 = 2.322; var = 2.322 - 1.42^2 = 0.3056
    assert_close(m["rollout_is_std"], t(math.sqrt(2.322 - 1.42**2)))
    # ESS = 1 / E[(w / 1.42)^2] = 1.42^2 / 2.322 (the +1e-8 in the divisor is below the tolerance)
    assert_close(m["rollout_is_eff_sample_size"], t(1.42**2 / 2.322))
    # per-sequence mean weights: 3.6 / 3 = 1.2 and 3.5 / 2 = 1.75
    assert_close(m["rollout_is_seq_mean"], t((1.2 + 1.75) / 2))
    assert_close(m["rollout_is_seq_std"], t(abs(1.75 - 1.2) / math.sqrt(2)))  # unbiased std of two values
    assert_close(m["rollout_is_seq_max_deviation"], t(0.75))
    # raw per-sequence means: (3 + 0.6 + 1) / 3 = 1.533 and (1.5 + 4) / 2 = 2.75 > 2
    assert_close(m["rollout_is_seq_fraction_high"], t(0.5))
    assert "rollout_is_oob_ratio" not in m


def test_token_mis_masks_outside_bounds():
    out = run(rollout_is="token", rollout_is_threshold="0.5_2.0")
    # 3.0 and 4.0 lie outside [0.5, 2]: weight 0; the others keep their raw value
    assert_close(out.weights, t([[0.0, 0.6, 1.0, 0.0], [1.5, 0.0, 0.0, 0.0]]))
    assert_close(out.metrics["rollout_is_oob_ratio"], t(0.4))
    assert_close(out.metrics["rollout_is_mean"], t(3.1 / 5))


def test_sequence_tis_and_batch_normalize():
    out = run(rollout_is="sequence", rollout_is_threshold=2.0)
    # products: 3 * 0.6 * 1 = 1.8 and 1.5 * 4 = 6 -> min(., 2) on every valid token
    assert_close(out.weights, t([[1.8, 1.8, 1.8, 0.0], [2.0, 2.0, 0.0, 0.0]]))
    m = out.metrics
    assert_close(m["rollout_is_max"], t(6.0))  # raw sequence weights
    assert_close(m["rollout_is_min"], t(1.8))
    assert_close(m["rollout_is_ratio_fraction_high"], t(0.5))  # one sequence of two above 2
    normed = run(rollout_is="sequence", rollout_is_threshold=2.0, rollout_is_batch_normalize=True)
    # mean over sequences of their weight: (1.8 + 2) / 2 = 1.9
    assert_close(normed.weights, out.weights / 1.9)
    assert_close(normed.metrics["rollout_is_batch_norm_factor"], t(1.9))
    token = run(rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=True)
    assert_close(token.weights, run(rollout_is="token", rollout_is_threshold=2.0).weights / 1.42)


@pytest.mark.parametrize(
    "option, threshold, kept, high, low",
    [
        # token_k1: keep r in [0.5, 2] (statistic -log r in [log 0.5, log 2]); 3.0 and 4.0 go
        ("token_k1", "0.5_2.0", [[0, 1, 1, 0], [1, 0, 0, 0]], 0.0, 0.4),
        # the same with the upper bound alone (lower = 1 / 2)
        ("token_k1", 2.0, [[0, 1, 1, 0], [1, 0, 0, 0]], 0.0, 0.4),
        # seq_sum_k1: sequence ratios 1.8 (kept) and 6 (statistic -log 6 < log 0.5: rejected)
        ("seq_sum_k1", 2.0, [[1, 1, 1, 0], [0, 0, 0, 0]], 0.0, 0.5),
        # seq_mean_k1 (geometric mean): 1.8^(1/3) = 1.216 kept, sqrt(6) = 2.449 rejected at 1.5
        ("seq_mean_k1", 1.5, [[1, 1, 1, 0], [0, 0, 0, 0]], 0.0, 0.5),
        # token_k2: (log r)^2 / 2 <= 0.5 <=> |log r| <= 1: log 3 = 1.099 and log 4 = 1.386 rejected
        ("token_k2", 0.5, [[0, 1, 1, 0], [1, 0, 0, 0]], 0.4, 0.0),
        # seq_max_k3: max of r - 1 - log r: row 0 3 - 1 - 1.0986 = 0.901 <= 1 kept; row 1 4 - 1 - 1.386 = 1.614
        ("seq_max_k3", 1.0, [[1, 1, 1, 0], [0, 0, 0, 0]], 0.5, 0.0),
    ],
)
def test_rejection(option, threshold, kept, high, low):
    out = run(rollout_rs=option, rollout_rs_threshold=threshold)
    assert out.weights is None
    assert_close(out.response_mask, t(kept))
    rejected_tokens = 5 - sum(map(sum, kept))
    m = out.metrics
    assert_close(m["rollout_rs_masked_fraction"], t(rejected_tokens / 5))
    assert_close(m[f"rollout_rs_{option}_masked_fraction"], t(rejected_tokens / 5))
    rejected_rows = sum(1 for row, k in zip(MASK.tolist(), kept) if row != k)
    assert_close(m["rollout_rs_seq_masked_fraction"], t(rejected_rows / 2))
    assert_close(m[f"rollout_rs_{option}_fraction_high"], t(high))
    assert_close(m[f"rollout_rs_{option}_fraction_low"], t(low))


def test_rejection_options_chain_and_weights_combine():
    # token_k2 at 0.5 drops 3.0 and 4.0; seq_sum_k1 at 2 drops row 1: both must pass
    out = run(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token_k2,seq_sum_k1",
              rollout_rs_threshold="0.5,2.0")
    assert_close(out.response_mask, t([[0, 1, 1, 0], [0, 0, 0, 0]]))
    assert_close(out.weights, t([[2.0, 0.6, 1.0, 0.0], [1.5, 2.0, 0.0, 0.0]]))  # weights ignore rejection
    assert_close(out.metrics["rollout_rs_masked_fraction"], t(3 / 5))
    # the token_k2 statistic: mean over 5 tokens of (log r)^2 / 2
    expected = sum(0.5 * math.log(r) ** 2 for r in (3.0, 0.6, 1.0, 1.5, 4.0)) / 5
    assert_close(out.metrics["rollout_rs_token_k2_mean"], t(expected))


def test_offpolicy_metrics():
    old = t([[-1.0, -2.0], [-1.0, 0.0]])
    rollout = t([[-1.5, -1.5], [-0.5, 0.0]])
    mask = t([[1, 1], [1, 0]])
    m = offpolicy_metrics(old, rollout, mask)
    # kl = mean(rollout - old) over 3 tokens = (-0.5 + 0.5 + 0.5) / 3
    assert_close(m["kl"], t(0.5 / 3))
    # k3 with log r = old - rollout = [0.5, -0.5, -0.5]: e^x - x - 1
    k3 = [math.exp(x) - x - 1 for x in (0.5, -0.5, -0.5)]
    assert_close(m["k3_kl"], t(sum(k3) / 3))
    # per-sequence mean logp: old [-1.5, -1.0], rollout [-1.5, -0.5]
    assert_close(m["training_ppl"], t((math.exp(1.5) + math.exp(1.0)) / 2))
    assert_close(m["rollout_ppl"], t((math.exp(1.5) + math.exp(0.5)) / 2))
    assert_close(m["training_log_ppl"], t(1.25))
    # log_ppl_diff per sequence = rollout mean - old mean = [0, 0.5]
    assert_close(m["log_ppl_diff"], t(0.25))
    assert_close(m["log_ppl_diff_max"], t(0.5))
    assert_close(m["log_ppl_diff_min"], t(0.0))
    assert_close(m["ppl_ratio"], t((1 + math.exp(0.5)) / 2))
    # chi2_token = mean(r^2) - 1 = (e^1 + e^-1 + e^-1) / 3 - 1; chi2_seq: row sums of log r = [0, -0.5]
    assert_close(m["chi2_token"], t((math.e + 2 / math.e) / 3 - 1))
    assert_close(m["chi2_seq"], t((1 + math.exp(-1.0)) / 2 - 1))


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"rollout_is": "tokens"}, "rollout_is="),
        ({"rollout_is": "token", "rollout_is_threshold": "2_1"}, "rollout_is_threshold="),
        ({"rollout_is": "token", "rollout_is_threshold": None}, "rollout_is_threshold=null"),
        ({"rollout_rs": "geometric", "rollout_rs_threshold": 2.0}, "seq_mean_k1"),
        ({"rollout_rs": "token_k1"}, "needs a threshold"),
        ({"rollout_rs": "token_k2", "rollout_rs_threshold": "0.1_2"}, "single upper bound"),
        ({"rollout_rs": "token_k1,seq_max_k2", "rollout_rs_threshold": "1,2,3"}, "one per rollout_rs option"),
        ({"loss_type": "ppo"}, "loss_type="),
    ],
)
def test_bad_settings_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        RolloutCorrectionSpec(**spec)


def test_k1_threshold_default_lower_is_reciprocal():
    assert parse_rs_thresholds(("token_k1", "token_k3"), "4.0") == {"token_k1": (0.25, 4.0), "token_k3": (None, 4.0)}


# ------------------------------------------------------------------------------------------------- bypass mode


def bypass(logprobs, spec, adv):
    # the denominators count the mask before rejection (the actor computes them on the batch's mask)
    inputs = policy_inputs(old_logprobs=ROLLOUT, logprobs=logprobs, advantages=adv, response_mask=MASK,
                              rollout_correction=RolloutCorrectionSpec(**spec), **loss_denominators(MASK))
    return compute_policy_loss(loss_mode="bypass_mode", inputs=inputs)


def test_bypass_ppo_clip_is_vanilla_against_the_rollout():
    adv = t([[1.0, -1.0, 2.0, 0.0], [-0.5, 1.0, 0.0, 0.0]])
    out = bypass(OLD, {"rollout_is": "token"}, adv)
    plain = compute_policy_loss(loss_mode="vanilla", inputs=policy_inputs(
        old_logprobs=ROLLOUT, logprobs=OLD, advantages=adv, response_mask=MASK))
    assert_close(out.loss, plain.loss)  # no extra weight: the ratio is the correction
    assert_close(out.metrics["rollout_corr/rollout_is_mean"], t(1.42))
    # with token_k1 at 2 the tokens of ratio 3 and 4 leave the mask (the denominator stays 5 tokens):
    # clipped losses -A clip(r, 0.8, 1.2): 0.6 -> -(-1)(0.8)... only kept tokens: r=0.6 (A=-1), 1.0 (A=2), 1.5 (A=-.5)
    # -A max-form: r=0.6, A=-1: max(0.6, 0.8) = 0.8; r=1, A=2: -2; r=1.5, A=-0.5: max(0.75, 0.6) = 0.75
    rs = bypass(OLD, {"rollout_rs": "token_k1", "rollout_rs_threshold": 2.0}, adv)
    assert_close(rs.loss, t((0.8 - 2.0 + 0.75) / 5))


def test_bypass_reinforce_uses_truncated_weights():
    adv = t([[1.0, -1.0, 2.0, 0.0], [-0.5, 1.0, 0.0, 0.0]])
    logprobs = OLD.clone().requires_grad_(True)
    out = bypass(logprobs, {"rollout_is": "token", "rollout_is_threshold": 2.0, "loss_type": "reinforce"}, adv)
    w = [2.0, 0.6, 1.0, 1.5, 2.0]
    a = [1.0, -1.0, 2.0, -0.5, 1.0]
    lp = [-1 + math.log(r) for r in (3.0, 0.6, 1.0, 1.5, 4.0)]
    assert_close(out.loss.detach(), t(-sum(wi * ai * li for wi, ai, li in zip(w, a, lp)) / 5))
    (grad,) = torch.autograd.grad(out.loss, logprobs)  # d/dlogp = -w A / N: the weights carry no gradient
    assert_close(grad, t([[-2.0, 0.6, -2.0, 0.0], [0.75, -2.0, 0.0, 0.0]]) / 5)
    assert_close(out.metrics["ppo_kl"], t(-sum(math.log(r) for r in (3.0, 0.6, 1.0, 1.5, 4.0)) / 5))


def test_bypass_needs_its_settings():
    with pytest.raises(ValueError, match="rollout_correction"):
        compute_policy_loss(loss_mode="bypass_mode", inputs=policy_inputs(
            old_logprobs=ROLLOUT, logprobs=OLD, advantages=OLD, response_mask=MASK))


# ---------------------------------------------------------------------------------------------- split invariance

SPLIT_SPECS = [
    {"rollout_is": "token", "rollout_is_threshold": 2.0},
    {"rollout_is": "sequence", "rollout_is_threshold": "0.5_2.0", "rollout_rs": "seq_mean_k1,token_k3",
         "rollout_rs_threshold": "1.3,0.2"},
    {"rollout_is": "token", "rollout_rs": "seq_sum_k1", "rollout_rs_threshold": 1.5},
]


@pytest.mark.parametrize("spec", SPLIT_SPECS)
def test_weights_and_masks_are_split_invariant(spec):
    from tests.core.test_microbatch_invariance import make_batch

    old, new, _, mask, _ = make_batch(3)
    whole = rollout_correction(new, old, mask, RolloutCorrectionSpec(**spec))
    for splits in (2, 4):
        parts = [rollout_correction(new[r], old[r], mask[r], RolloutCorrectionSpec(**spec))
                 for r in torch.arange(len(old)).chunk(splits)]
        assert_close(torch.cat([p.weights for p in parts]), whole.weights)
        assert_close(torch.cat([p.response_mask for p in parts]), whole.response_mask)


@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
@pytest.mark.parametrize("spec", SPLIT_SPECS)
def test_bypass_gradient_is_split_invariant(spec, loss_type):
    from tests.core.test_microbatch_invariance import gradient, make_batch

    old, new, adv, mask, _ = make_batch(4)
    settings = RolloutCorrectionSpec(**spec, loss_type=loss_type)

    def loss_fn(logprobs, rows, denominators):
        inputs = policy_inputs(old_logprobs=old[rows], logprobs=logprobs[rows], advantages=adv[rows],
                                  response_mask=mask[rows], rollout_correction=settings, **denominators)
        return compute_policy_loss(loss_mode="bypass_mode", inputs=inputs).loss

    whole_grad, whole_loss = gradient(loss_fn, new, 1, mask)
    assert whole_grad.abs().sum() > 0
    assert loss_denominators(mask)["global_num_tokens"] > 0
    for splits in (2, 4):
        grad, loss = gradient(loss_fn, new, splits, mask)
        assert_close(grad, whole_grad)
        assert_close(loss, whole_loss)


# verl's compute_rs_metrics (verl/trainer/ppo/rollout_corr_helper.py) emits these per option; seq_fraction_low only
# for the k1 options (they have a lower bound).
VERL_RS_SUFFIXES = ("mean", "max", "min", "std", "fraction_high", "fraction_low", "seq_mean", "seq_std", "seq_max",
                    "seq_min", "seq_max_deviation", "seq_fraction_high", "masked_fraction", "seq_masked_fraction")


@pytest.mark.parametrize("option", ["token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
                                    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3"])
def test_every_rejection_metric_verl_emits(option):
    m = run(rollout_rs=option, rollout_rs_threshold=2.0).metrics
    expected = {f"rollout_rs_{option}_{s}" for s in VERL_RS_SUFFIXES}
    if option.endswith("k1"):
        expected.add(f"rollout_rs_{option}_seq_fraction_low")
    assert {k for k in m if k.startswith(f"rollout_rs_{option}_")} == expected


def test_rejection_sequence_summary_by_hand():
    # token_k1 at 2 (bounds log 0.5 .. log 2 on -log r): per-row means of -log r:
    #   row 0: -(log 3 + log 0.6 + 0) / 3 = -log(1.8) / 3 = -0.196; row 1: -(log 1.5 + log 4) / 2 = -log(6) / 2 = -0.896
    m = run(rollout_rs="token_k1", rollout_rs_threshold=2.0).metrics
    a, b = -math.log(1.8) / 3, -math.log(6.0) / 2
    assert_close(m["rollout_rs_token_k1_seq_std"], t(abs(a - b) / math.sqrt(2)))  # unbiased std of two values
    assert_close(m["rollout_rs_token_k1_seq_fraction_high"], t(0.0))  # neither above log 2 = 0.693
    assert_close(m["rollout_rs_token_k1_seq_fraction_low"], t(0.5))  # row 1 below log 0.5 = -0.693
    # seq_max_k3 at 1: per-row max of r - 1 - log r: row 0 3 - 1 - log 3 = 0.901, row 1 4 - 1 - log 4 = 1.614
    m = run(rollout_rs="seq_max_k3", rollout_rs_threshold=1.0).metrics
    a, b = 2 - math.log(3.0), 3 - math.log(4.0)
    assert_close(m["rollout_rs_seq_max_k3_seq_std"], t(abs(a - b) / math.sqrt(2)))
    assert_close(m["rollout_rs_seq_max_k3_seq_fraction_high"], t(0.5))  # row 1 above 1
    assert "rollout_rs_seq_max_k3_seq_fraction_low" not in m
    one_row = rollout_correction(OLD[:1], ROLLOUT[:1], MASK[:1],
                                 RolloutCorrectionSpec(rollout_rs="seq_max_k3", rollout_rs_threshold=1.0)).metrics
    assert_close(one_row["rollout_rs_seq_max_k3_seq_std"], t(0.0))  # one sequence: 0, as verl


def test_k3_kl_is_not_clamped_as_in_verl():
    # log r = 25 on one token, beyond the +-20 clamp the chi-squares use: k3 = e^25 - 25 - 1
    old, rollout, mask = t([[24.0, 0.0]]), t([[-1.0, 0.0]]), t([[1, 0]])
    m = offpolicy_metrics(old, rollout, mask)
    assert_close(m["k3_kl"], t(math.exp(25.0) - 26.0))
    assert_close(m["chi2_token"], t(math.exp(40.0) - 1.0))  # r^2 with log r clamped to 20, as verl


def test_a_batch_without_a_valid_token_reports_zero_not_minus_one():
    # verl asserts there is a valid token; here every metric is 0, the chi-squares included (mean of nothing - 1
    # would say -1, which no chi-square can be)
    m = offpolicy_metrics(t([[-1.0, -2.0]]), t([[-1.5, -1.5]]), t([[0, 0]]))
    assert_close(m["chi2_token"], t(0.0))
    assert_close(m["chi2_seq"], t(0.0))
    assert all(float(v) == 0.0 for v in m.values()), m
