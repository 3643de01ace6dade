"""The on-policy distillation loss against verl's (verl-project/verl at 1dda039b9: verl/trainer/distillation/losses.py
``distillation_ppo_loss`` / ``distillation_loss`` / ``compute_distillation_loss_reverse_kl_estimator``, and from
verl/trainer/ppo/core_algos.py ``kl_penalty``, ``kl_penalty_forward``, ``agg_loss``, ``compute_policy_loss_vanilla``),
copied below with the config objects replaced by plain arguments and ``.item()`` dropped from the metrics."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from npu_rl.core.distillation import (
    DistillationSpec,
    combined_loss,
    distillation_loss,
    distillation_problems,
    distillation_token_losses,
)
from tests.core.policy_inputs import policy_inputs

# ------------------------------------------------------------------------------------------ verl's code (reference)


def verl_masked_sum(values, mask):
    return (values * mask).sum()


def verl_masked_mean(values, mask):
    return (values * mask).sum() / (mask.sum() + 1e-8)


def verl_kl_penalty_forward(logprob, ref_logprob, kl_penalty):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        kl = torch.clamp(kl, min=-20, max=20)
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).contiguous()
        return torch.clamp(kld, min=-10, max=10)
    raise NotImplementedError


def verl_kl_penalty(logprob, ref_logprob, kl_penalty):
    base_kl_penalty = kl_penalty[:-1] if kl_penalty.endswith("+") else kl_penalty
    forward_score = verl_kl_penalty_forward(logprob, ref_logprob, base_kl_penalty)
    if not kl_penalty.endswith("+") or kl_penalty in ("mse", "k2"):
        return forward_score
    backward_score = 0.5 * (logprob - ref_logprob).square()
    return backward_score - backward_score.detach() + forward_score.detach()


def verl_agg_loss(loss_mat, loss_mask, loss_agg_mode, dp_size=1, batch_num_tokens=None, global_batch_size=None,
                  loss_scale_factor=None):
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            batch_num_tokens = loss_mask.sum()
        loss = verl_masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    elif loss_agg_mode in ["seq-mean-token-sum", "seq-mean-token-sum-norm"]:
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()
        if global_batch_size is None:
            global_batch_size = seq_mask.sum()
        loss = verl_masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size
        if loss_agg_mode == "seq-mean-token-sum-norm":
            if loss_scale_factor is None:
                loss_scale_factor = loss_mask.shape[-1]
            loss /= loss_scale_factor
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
        seq_mask = (seq_mask > 0).float()
        if global_batch_size is None:
            global_batch_size = seq_mask.sum()
        loss = verl_masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size
    else:
        raise ValueError(loss_agg_mode)
    return loss


def verl_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, clip_ratio_low, clip_ratio_high,
                 clip_ratio_c=3.0):
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = verl_masked_mean(-negative_approx_kl, response_mask)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = verl_masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = verl_masked_mean(torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(),
                                         response_mask)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    pg_loss = verl_agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, {"actor/pg_clipfrac": pg_clipfrac, "actor/ppo_kl": ppo_kl,
                     "actor/pg_clipfrac_lower": pg_clipfrac_lower}


def verl_distillation_loss(student, teacher, old, mask, loss_mode, loss_max_clamp, use_policy_gradient, agg,
                           clip_low, clip_high):
    """verl's ``distillation_loss`` with the estimator loss (``compute_distillation_loss_reverse_kl_estimator``)."""
    distillation_losses = verl_kl_penalty(student, teacher, loss_mode)
    valid = mask.bool()
    metrics = {"distillation/abs_loss": distillation_losses[valid].abs().mean(),
               "distillation/loss_min": distillation_losses[valid].min(),
               "distillation/loss_max": distillation_losses[valid].max()}
    if loss_max_clamp is not None:
        distillation_losses = distillation_losses.clamp(min=-loss_max_clamp, max=loss_max_clamp)
    if use_policy_gradient:
        loss, pg_metrics = verl_vanilla(old, student, -distillation_losses.detach(), mask, agg, clip_low, clip_high)
        metrics.update({f"distillation/{k[len('actor/'):]}": v for k, v in pg_metrics.items()})
    else:
        loss = verl_agg_loss(distillation_losses, mask, agg)
    return loss, metrics


def verl_distillation_ppo_loss(policy_loss, distill_loss, use_task_rewards, use_policy_gradient, coef):
    """The combination at the end of verl's ``distillation_ppo_loss`` (``policy_loss``: ``ppo_loss``'s value)."""
    if not use_task_rewards and not use_policy_gradient:
        policy_loss = 0.0
    elif not use_task_rewards:
        policy_loss = 0.0
    distillation_loss_coef = coef if use_task_rewards else 1.0
    return policy_loss + distill_loss * distillation_loss_coef


# ------------------------------------------------------------------------------------------------------ tests


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    student = -torch.rand(3, 5, generator=g) * 3
    teacher = -torch.rand(3, 5, generator=g) * 3
    teacher[0, 1] = -40.0  # a token the teacher finds near impossible: k3's clamps and loss_max_clamp matter
    old = student + 0.3 * torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.float32)
    return student, teacher, old, mask


def spec(**kw) -> DistillationSpec:
    base = dict(loss_mode="k3", use_task_rewards=False, distillation_loss_coef=1.0, loss_max_clamp=None,
                use_policy_gradient=False, clip_ratio_low=0.2, clip_ratio_high=0.28)
    return DistillationSpec(**(base | kw))


CASES = [(mode, pg, clamp, agg) for mode in ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
         for pg in (False, True) for clamp in (None, 10.0, 0.5)
         for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
         if pg or mode not in ("k1", "kl")]


@pytest.mark.parametrize("mode,pg,clamp,agg", CASES)
def test_equals_verl(mode, pg, clamp, agg):
    student, teacher, old, mask = batch()
    ours_in = student.clone().requires_grad_(True)
    theirs_in = student.clone().requires_grad_(True)
    s = spec(loss_mode=mode, use_policy_gradient=pg, loss_max_clamp=clamp)
    inputs = policy_inputs(old_logprobs=old, logprobs=ours_in, advantages=torch.zeros_like(old), response_mask=mask,
                           loss_agg_mode=agg, loss_scale_factor=None)
    ours = distillation_loss(inputs=inputs, teacher_logprobs=teacher, spec=s)
    loss, metrics = verl_distillation_loss(theirs_in, teacher, old, mask, mode, clamp, pg, agg, 0.2, 0.28)
    assert_close(ours.loss, loss)
    assert set(ours.metrics) == set(metrics)
    for key, value in metrics.items():
        assert_close(ours.metrics[key], value.detach(), msg=key)
    (g_ours,) = torch.autograd.grad(ours.loss, ours_in)
    (g_theirs,) = torch.autograd.grad(loss, theirs_in)
    assert_close(g_ours, g_theirs)


@pytest.mark.parametrize("task,pg", [(False, False), (False, True), (True, False), (True, True)])
def test_combination_equals_verl(task, pg):
    policy, distill = torch.tensor(0.7), torch.tensor(-0.2)
    assert_close(combined_loss(policy, distill, spec(use_task_rewards=task, use_policy_gradient=pg,
                                                     distillation_loss_coef=1.5)),
                 torch.as_tensor(verl_distillation_ppo_loss(policy, distill, task, pg, 1.5)))


def test_k3_by_hand():
    # s = log 0.5, q = log 0.25: q - s = -ln 2, k3 = exp(-ln 2) + ln 2 - 1 = 0.5 + 0.693147 - 1
    out = distillation_token_losses(student_logprobs=torch.tensor([[math.log(0.5)]]),
                                    teacher_logprobs=torch.tensor([[math.log(0.25)]]), loss_mode="k3")
    assert_close(out, torch.tensor([[0.5 + math.log(2) - 1]]))


def test_equal_student_and_teacher_give_zero_loss_and_no_gradient():
    student, _, _, mask = batch()
    x = student.clone().requires_grad_(True)
    inputs = policy_inputs(old_logprobs=student, logprobs=x, advantages=torch.zeros_like(x), response_mask=mask)
    out = distillation_loss(inputs=inputs, teacher_logprobs=student, spec=spec())
    assert float(out.loss.detach()) == 0.0
    (grad,) = torch.autograd.grad(out.loss, x)
    assert float(grad.abs().max()) == 0.0


def test_reverse_kl_gradient_lowers_the_loss():
    # one softmax "student" over 4 tokens, teacher fixed; sampled tokens from the student: the k3 loss falls
    torch.manual_seed(0)
    logits = torch.zeros(4, requires_grad=True)
    teacher = torch.log_softmax(torch.tensor([2.0, 0.0, -1.0, -2.0]), -1)
    opt = torch.optim.SGD([logits], lr=0.5)
    kls = []
    for _ in range(60):
        logp = torch.log_softmax(logits, -1)
        kls.append(float((logp.exp() * (logp - teacher)).sum()))
        tokens = torch.multinomial(logp.exp().detach(), 64, replacement=True)
        s = logp[tokens][None]
        inputs = policy_inputs(old_logprobs=s.detach(), logprobs=s, advantages=torch.zeros_like(s),
                               response_mask=torch.ones_like(s))
        out = distillation_loss(inputs=inputs, teacher_logprobs=teacher[tokens][None], spec=spec())
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    assert kls[-1] < 0.2 * kls[0]


def test_problems_name_the_key_and_the_way_out():
    key = "distillation.distillation_loss"
    (topk,) = distillation_problems("forward_kl_topk", False, "vanilla", key)
    assert "loss_mode=forward_kl_topk" in topk and "not implemented" in topk
    (k1,) = distillation_problems("k1", False, "vanilla", key)
    assert "use_policy_gradient=True" in k1
    assert distillation_problems("k1", True, "vanilla", key) == []
    (mode,) = distillation_problems("k3", True, "gspo", key)
    assert "vanilla" in mode
    (bad,) = distillation_problems("k4", False, "vanilla", key)
    assert "k4" in bad and "k3" in bad
