"""The on-policy distillation loss against verl's (verl-project/verl at 1dda039b9: verl/trainer/distillation/losses.py
``distillation_ppo_loss`` / ``distillation_loss`` / ``compute_distillation_loss_reverse_kl_estimator``, and from
verl/trainer/ppo/core_algos.py ``kl_penalty``, ``kl_penalty_forward``, ``agg_loss``, ``compute_policy_loss_vanilla``),
copied below with the config objects replaced by plain arguments and ``.item()`` dropped from the metrics. The top-k
forward KL against verl/trainer/distillation/fsdp/losses.py ``compute_forward_kl_topk`` / ``kl_divergence`` (its
log-softmax path, without the nested-tensor and Ulysses plumbing) and losses.py ``compute_forward_kl_topk``."""

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
    forward_kl_topk,
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


def verl_kl_divergence(log_q, log_p):
    log_p = log_p.float()
    log_q = log_q.float()
    p = log_p.exp()
    kld = p * (log_p - log_q)
    return kld.sum(dim=-1)


def verl_fsdp_forward_kl_topk(student_logits, teacher_topk_log_probs, teacher_topk_ids, log_prob_min_clamp):
    """verl/trainer/distillation/fsdp/losses.py ``compute_forward_kl_topk`` (use_chunked_topk=False)."""
    student_log_probs = torch.nn.functional.log_softmax(student_logits, dim=-1)
    student_topk_ids = torch.topk(student_log_probs, k=teacher_topk_ids.shape[-1], dim=-1).indices
    student_topk_log_probs = torch.gather(student_log_probs, dim=-1, index=teacher_topk_ids)
    student_mass = student_topk_log_probs.exp().sum(dim=-1)
    teacher_mass = teacher_topk_log_probs.exp().sum(dim=-1)
    if log_prob_min_clamp is not None:
        student_topk_log_probs = student_topk_log_probs.clamp_min(log_prob_min_clamp)
        teacher_topk_log_probs = teacher_topk_log_probs.clamp_min(log_prob_min_clamp)
    distillation_losses = verl_kl_divergence(log_q=student_topk_log_probs, log_p=teacher_topk_log_probs)
    overlap_mask = (teacher_topk_ids.unsqueeze(-1) == student_topk_ids.unsqueeze(-2)).any(dim=-1)
    overlap_count = overlap_mask.sum(dim=-1)
    token_kl = teacher_topk_log_probs.exp() * (teacher_topk_log_probs - student_topk_log_probs)
    overlap_token_advantage_sum = (-token_kl * overlap_mask).sum(dim=-1)
    overlap_token_advantage = overlap_token_advantage_sum / overlap_count.clamp_min(1)
    overlap_token_advantage = torch.where(
        overlap_count > 0, overlap_token_advantage, torch.zeros_like(overlap_token_advantage)
    )
    return {"distillation_losses": distillation_losses, "student_mass": student_mass, "teacher_mass": teacher_mass,
            "overlap_count": overlap_count, "overlap_token_advantage": overlap_token_advantage}


def verl_topk_distillation_loss(model_output, student, old, mask, k, loss_max_clamp, use_policy_gradient, agg,
                                clip_low, clip_high):
    """verl's ``distillation_loss`` with losses.py ``compute_forward_kl_topk`` (the metrics and the clamp at 0)."""
    distillation_losses = model_output["distillation_losses"]
    student_mass, teacher_mass = model_output["student_mass"], model_output["teacher_mass"]
    overlap_count, overlap_token_advantage = model_output["overlap_count"], model_output["overlap_token_advantage"]
    response_mask_bool = mask.bool()
    overlap_metrics = {}
    valid_overlap_count = overlap_count[response_mask_bool]
    overlap_metrics["distillation/overlap_ratio"] = valid_overlap_count.float().mean() / k
    overlap_position_mask = response_mask_bool & (overlap_count > 0)
    if overlap_position_mask.any():
        overlap_metrics["distillation/overlap_token_advantage"] = (
            overlap_token_advantage[overlap_position_mask].mean()
        )
    else:
        overlap_metrics["distillation/overlap_token_advantage"] = torch.tensor(0.0)
    student_mass = student_mass[response_mask_bool]
    teacher_mass = teacher_mass[response_mask_bool]
    metrics = {
        "distillation/student_mass": student_mass.mean(),
        "distillation/student_mass_min": student_mass.min(),
        "distillation/student_mass_max": student_mass.max(),
        "distillation/teacher_mass": teacher_mass.mean(),
        "distillation/teacher_mass_min": teacher_mass.min(),
        "distillation/teacher_mass_max": teacher_mass.max(),
        **overlap_metrics,
    }
    distillation_losses = distillation_losses.clamp_min(0.0)
    metrics["distillation/loss_min"] = distillation_losses[response_mask_bool].min()
    metrics["distillation/loss_max"] = distillation_losses[response_mask_bool].max()
    if loss_max_clamp is not None:
        distillation_losses = distillation_losses.clamp(min=-loss_max_clamp, max=loss_max_clamp)
    if use_policy_gradient:
        loss, pg_metrics = verl_vanilla(old, student, -distillation_losses.detach(), mask, agg, clip_low, clip_high)
        metrics.update({f"distillation/{k_[len('actor/'):]}": v for k_, v in pg_metrics.items()})
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


TOPK_CASES = [(k, pg, clamp, min_clamp, agg) for k in (1, 4) for pg in (False, True) for clamp in (None, 0.5)
              for min_clamp in (None, -3.0) for agg in ("token-mean", "seq-mean-token-mean")]


@pytest.mark.parametrize("k,pg,clamp,min_clamp,agg", TOPK_CASES)
def test_forward_kl_topk_equals_verl(k, pg, clamp, min_clamp, agg):
    g = torch.Generator().manual_seed(k)
    _, _, _, mask = batch()
    vocab = 11
    logits = torch.randn(3, 5, vocab, generator=g) * 2
    teacher_all = torch.log_softmax(torch.randn(3, 5, vocab, generator=g) * 3, -1)
    teacher_lp, teacher_ids = torch.topk(teacher_all, k, dim=-1)
    tokens = torch.randint(0, vocab, (3, 5), generator=g)
    old = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0] + 0.1 * torch.randn(3, 5, generator=g)
    ours_logits, theirs_logits = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    # ours: the student's log-probs at the teacher's ids and its own top-k, as npu_rl.models.forward gives them
    log_probs = torch.log_softmax(ours_logits, -1)
    topk = {"student_topk_logprobs": log_probs.gather(-1, teacher_ids), "teacher_topk_logprobs": teacher_lp,
            "student_topk_ids": torch.topk(log_probs.detach(), k, dim=-1).indices, "teacher_topk_ids": teacher_ids}
    student = log_probs.gather(-1, tokens[..., None])[..., 0]
    inputs = policy_inputs(old_logprobs=old, logprobs=student, advantages=torch.zeros_like(old), response_mask=mask,
                           loss_agg_mode=agg, loss_scale_factor=None)
    s = spec(loss_mode="forward_kl_topk", use_policy_gradient=pg, loss_max_clamp=clamp, topk=k,
             log_prob_min_clamp=min_clamp)
    ours = distillation_loss(inputs=inputs, spec=s, topk=topk)
    out = verl_fsdp_forward_kl_topk(theirs_logits, teacher_lp, teacher_ids, min_clamp)
    theirs_student = torch.log_softmax(theirs_logits, -1).gather(-1, tokens[..., None])[..., 0]
    loss, metrics = verl_topk_distillation_loss(out, theirs_student, old, mask, k, clamp, pg, agg, 0.2, 0.28)
    assert_close(ours.loss, loss)
    assert set(ours.metrics) == set(metrics)
    for key, value in metrics.items():
        assert_close(ours.metrics[key], torch.as_tensor(value).detach().float(), msg=key)
    (g_ours,) = torch.autograd.grad(ours.loss, ours_logits)
    (g_theirs,) = torch.autograd.grad(loss, theirs_logits)
    assert_close(g_ours, g_theirs)
    assert clamp is not None or float(g_ours.abs().max()) > 0


def test_forward_kl_topk_of_the_full_vocabulary_is_the_forward_kl():
    # K = V: the top-k covers every token, so the loss is KL(teacher || student) exactly, and zero at equality
    g = torch.Generator().manual_seed(3)
    student = torch.log_softmax(torch.randn(2, 3, 6, generator=g), -1)
    teacher = torch.log_softmax(torch.randn(2, 3, 6, generator=g), -1)
    lp, ids = torch.topk(teacher, 6, dim=-1)
    out = forward_kl_topk(student_topk_logprobs=student.gather(-1, ids), teacher_topk_logprobs=lp,
                          student_topk_ids=ids, teacher_topk_ids=ids, log_prob_min_clamp=None)
    assert_close(out["distillation_losses"], (teacher.exp() * (teacher - student)).sum(-1))
    assert_close(out["teacher_mass"], torch.ones(2, 3))
    same = forward_kl_topk(student_topk_logprobs=lp, teacher_topk_logprobs=lp, student_topk_ids=ids,
                           teacher_topk_ids=ids, log_prob_min_clamp=None)
    assert float(same["distillation_losses"].abs().max()) < 1e-6
    assert bool((same["overlap_count"] == 6).all())


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
    assert distillation_problems("forward_kl_topk", False, "vanilla", key, topk=32) == []
    (topk,) = distillation_problems("forward_kl_topk", False, "vanilla", key, topk=0)
    assert f"{key}.topk=0" in topk
    (k1,) = distillation_problems("k1", False, "vanilla", key)
    assert "use_policy_gradient=True" in k1
    assert distillation_problems("k1", True, "vanilla", key) == []
    (mode,) = distillation_problems("k3", True, "gspo", key)
    assert "vanilla" in mode
    (bad,) = distillation_problems("k4", False, "vanilla", key)
    assert "k4" in bad and "k3" in bad
