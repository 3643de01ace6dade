"""A user's own estimator, loss or KL estimator, plugged in by file path or dotted path; clear errors otherwise."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch.testing import assert_close

from npu_rl.core import (
    ADV_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageInputs,
    check_kl_type,
    compute_advantages,
    compute_policy_loss,
    kl_penalty,
)
from tests.core.policy_inputs import policy_inputs

PLUGIN = textwrap.dedent(
    """
    import torch
    from npu_rl.core import AdvantageOutput, LossOutput

    def centred(inputs):
        scores = inputs.token_level_rewards.sum(-1)
        adv = (scores - scores.mean()).unsqueeze(-1) * inputs.response_mask
        return AdvantageOutput(adv, adv)

    def reinforce(inputs):
        loss = inputs.aggregate(-inputs.advantages * inputs.logprobs)
        return LossOutput(loss, {})

    def squared_kl(*, logprobs, ref_logprobs):
        return (logprobs - ref_logprobs) ** 2

    def old_style(token_level_rewards, response_mask, index):
        return token_level_rewards, token_level_rewards

    def wrong_output(inputs):
        return inputs.token_level_rewards
    """
)

REWARDS = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
MASK = torch.ones(2, 2)


@pytest.fixture()
def plugin_file(tmp_path):
    path = tmp_path / "my_algos.py"
    path.write_text(PLUGIN)
    return str(path)


def test_estimator_from_a_file(plugin_file):
    name = f"{plugin_file}:centred"
    ADV_ESTIMATORS.check(name)
    out = compute_advantages(
        adv_estimator=name, inputs=AdvantageInputs(token_level_rewards=REWARDS, response_mask=MASK)
    )
    # scores [1, 0], mean 0.5
    assert_close(out.advantages, torch.tensor([[0.5, 0.5], [-0.5, -0.5]]))


def test_loss_from_a_dotted_path(tmp_path, monkeypatch):
    (tmp_path / "user_losses_for_test.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    name = "user_losses_for_test:reinforce"
    POLICY_LOSSES.check(name)
    logp = torch.tensor([[-1.0, -2.0]])
    inputs = policy_inputs(
        old_logprobs=logp, logprobs=logp, advantages=torch.ones(1, 2), response_mask=torch.ones(1, 2)
    )
    assert_close(compute_policy_loss(loss_mode=name, inputs=inputs).loss, torch.tensor(1.5))


def test_kl_estimator_from_a_file(plugin_file):
    name = f"{plugin_file}:squared_kl"
    check_kl_type(name)
    check_kl_type(name + "+")
    logp = torch.tensor([[0.5]], requires_grad=True)
    value = kl_penalty(logprobs=logp, ref_logprobs=torch.zeros(1, 1), kl_type=name + "+")
    assert_close(value, torch.tensor([[0.25]]))
    (grad,) = torch.autograd.grad(value.sum(), logp)
    assert_close(grad, torch.tensor([[0.5]]))  # k2's gradient: d - 0


def test_signature_mismatch_names_the_function(plugin_file):
    name = f"{plugin_file}:old_style"
    for _ in range(2):  # and it is not cached as if it were fine
        with pytest.raises(TypeError, match=r"old_style\(token_level_rewards, response_mask, index\).*AdvantageInputs"):
            ADV_ESTIMATORS.check(name)
    with pytest.raises(TypeError, match="old_style.*PolicyLossInputs"):
        POLICY_LOSSES.check(name)
    with pytest.raises(TypeError, match="old_style.*ref_logprobs"):
        check_kl_type(name)


def test_wrong_output_names_the_function(plugin_file):
    with pytest.raises(TypeError, match="wrong_output.*expected \\(advantages, returns\\)"):
        compute_advantages(
            adv_estimator=f"{plugin_file}:wrong_output",
            inputs=AdvantageInputs(token_level_rewards=REWARDS, response_mask=MASK),
        )


def test_missing_function_lists_what_the_file_defines(plugin_file):
    with pytest.raises(AttributeError, match="no attribute 'nope'.*centred"):
        ADV_ESTIMATORS.check(f"{plugin_file}:nope")


def test_registering_a_bad_signature_fails_at_import_time():
    with pytest.raises(TypeError, match="two_args"):

        @POLICY_LOSSES.register("test_two_args")
        def two_args(inputs, extra):
            raise AssertionError("never called")

    assert "test_two_args" not in POLICY_LOSSES
