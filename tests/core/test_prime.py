"""PRIME's math against verl-recipe's (verl-project/verl-recipe at 48ea0a797fa29867ea0ad92aff7d284eec7d4be3:
prime/prime_core_algos.py ``compute_rloo_advantage_return`` / ``compute_ce_dpo_loss_rm`` / ``compute_dpo_accuracy``
/ ``compute_dpo_abs_accuracy``, the token scores of prime/prime_dp_rm.py ``_forward_micro_batch`` (lambda 0) and
``prime_norm``, and prime/prime_ray_trainer.py ``filter_and_downsample``), copied below with DataProto and the
config replaced by plain arguments; verl's ``masked_whiten`` (verl/utils/torch_functional.py) copied with it."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from npu_rl.core.prime import (
    dpo_abs_accuracy,
    dpo_accuracy,
    group_filter_mask,
    implicit_log_ratio,
    implicit_prm_ce_loss,
    implicit_token_scores,
    last_token_mask,
    prime_rloo_advantages,
    prioritised_keep,
)

# ------------------------------------------------------------------------------------------ verl's code (reference)


def verl_masked_mean(values, mask, axis=None):
    return (values * mask).sum(axis=axis) / (mask.sum(axis=axis) + 1e-8)


def verl_masked_var(values, mask, unbiased=True):
    mean = verl_masked_mean(values, mask)
    centered_values = values - mean
    variance = verl_masked_mean(centered_values**2, mask)
    mask_sum = mask.sum()
    bessel_correction = mask_sum / (mask_sum - 1)
    return variance * bessel_correction


def verl_masked_whiten(values, mask, shift_mean=True):
    mean, var = verl_masked_mean(values, mask), verl_masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened += mean
    return whitened


def verl_compute_rloo_advantage_return(batch, response_mask, n_samples, reward_dpo_coef, reward_gt_coef):
    def masked_rloo(reward_tensor_original, mask_tensor):
        reward_tensor = reward_tensor_original.clone()
        reward_tensor[~mask_tensor] = 0
        for start_pos in range(0, reward_tensor.shape[0], n_samples):
            cur_rewards_mean = torch.cat(
                [
                    reward_tensor[pos : pos + 1][mask_tensor[pos : pos + 1]].mean(dim=0, keepdim=True)
                    for pos in range(start_pos, start_pos + n_samples)
                ],
                dim=0,
            )
            cur_rewards_sum = cur_rewards_mean.sum()
            cur_reward_baseline = cur_rewards_sum / (n_samples - 1)
            reward_tensor[start_pos : start_pos + n_samples][mask_tensor[start_pos : start_pos + n_samples]] = (
                reward_tensor[start_pos : start_pos + n_samples][mask_tensor[start_pos : start_pos + n_samples]]
                * (n_samples / (n_samples - 1))
                - cur_reward_baseline
            )
        return reward_tensor

    reward_tensors = []
    with torch.no_grad():
        if "rm_scores" in batch and reward_dpo_coef != 0.0:
            reward_tensors.append(masked_rloo(batch["rm_scores"], response_mask.bool()) * reward_dpo_coef)
        if "acc" in batch and reward_gt_coef != 0.0:
            reward_tensor = torch.zeros_like(response_mask, dtype=torch.float32)
            reward_mask = torch.zeros_like(response_mask, dtype=torch.bool)
            prompt_length = batch["prompts"].shape[-1]
            valid_response_length = batch["attention_mask"][:, prompt_length:].sum(-1)
            rows = torch.arange(0, valid_response_length.shape[0], dtype=torch.long)
            reward_mask[rows, valid_response_length - 1] = True
            reward_tensor[rows, valid_response_length - 1] = batch["acc"]
            reward_tensors.append(masked_rloo(reward_tensor, reward_mask) * reward_gt_coef)
        final_reward_tensor = sum(reward_tensors)
        returns = (final_reward_tensor * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
        advantages = verl_masked_whiten(returns.clone(), response_mask)
        return advantages, returns


def verl_compute_ce_dpo_loss_rm(token_level_scores, acc, response_mask, beta):
    cur_scores = ((token_level_scores * response_mask).sum(dim=1) * beta).sigmoid()
    return torch.nn.functional.binary_cross_entropy(cur_scores, acc)


def verl_token_scores(rm_log_labels, ref_log_labels, max_positions, beta, prime_norm):
    """prime_dp_rm.py: q, then r = q * beta (lambda 0), token granularity, then prime_norm over the batch."""
    num_actions = rm_log_labels.shape[-1]
    q = rm_log_labels[:, -num_actions:] - ref_log_labels[:, -num_actions:]
    for i in range(q.shape[0]):
        q[i, max_positions[i] :] = 0
    r = q * beta
    token_level_score = torch.zeros_like(q)
    for i in range(q.shape[0]):
        token_level_score[i, : max_positions[i] - 1] = r[i, : max_positions[i] - 1]
    if prime_norm == "batch_norm":
        reverse_cumsum = torch.cumsum(token_level_score.flip(dims=[1]), dim=-1).flip(dims=[1])
        token_level_score = token_level_score / (reverse_cumsum.abs().max() + 1e-6)
    return token_level_score, q


def verl_compute_dpo_accuracy(token_level_scores, acc, response_mask, n_samples):
    dpo_acc = []
    for start_id in range(0, token_level_scores.shape[0], n_samples):
        cur_scores = (
            token_level_scores[start_id : start_id + n_samples] * response_mask[start_id : start_id + n_samples]
        ).sum(dim=1)

        def get_upper_triangle(tensor_x):
            diff_matrix = tensor_x.unsqueeze(1) - tensor_x.unsqueeze(0)
            upper_tri_indices = torch.triu(torch.ones_like(diff_matrix).bool(), diagonal=1)
            return diff_matrix[upper_tri_indices]

        cur_acc_diff = get_upper_triangle(acc[start_id : start_id + n_samples])
        cur_score_diff = get_upper_triangle(cur_scores)
        cur_score_prediction = (cur_score_diff > 0).float()
        if cur_acc_diff.abs().sum() == 0:
            cur_acc = torch.zeros_like(cur_score_prediction[0]) + 0.5
        else:
            cur_acc = (
                ((cur_score_diff > 0) == (cur_acc_diff > 0)).float() * cur_acc_diff.abs()
            ).sum() / cur_acc_diff.abs().sum()
        dpo_acc.append(cur_acc.unsqueeze(0))
    return torch.cat(dpo_acc, dim=0).mean()


def verl_compute_dpo_abs_accuracy(token_level_scores, acc, response_mask, n_samples):
    return (torch.sign((token_level_scores * response_mask).sum(dim=-1)) == torch.sign(acc * 2 - 1)).float().mean()


def verl_filter_mask(scores, response_lengths, n_samples, filter_accuracy, lower, upper, filter_truncate, max_len):
    """filter_and_downsample up to its reorder: the per-group mask."""
    reward_matrix = torch.tensor(scores).reshape(-1, n_samples)
    filter_mask = torch.ones((reward_matrix.shape[0]), dtype=torch.bool)
    if filter_accuracy:
        acc_tensor = torch.mean(reward_matrix, dim=-1)
        filter_mask[(acc_tensor > upper) | (acc_tensor < lower)] = False
    if filter_truncate:
        length_tensor = torch.max(response_lengths.reshape(-1, n_samples), dim=-1)[0]
        filter_mask[length_tensor >= max_len - 1] = False
    return filter_mask


# ------------------------------------------------------------------------------------------ hand-made batches

N = 4  # samples per group
LENGTHS = torch.tensor([5, 3, 6, 1, 4, 6, 2, 5])  # valid response tokens per row, two groups of four
T = 6


def response_mask() -> torch.Tensor:
    return (torch.arange(T).unsqueeze(0) < LENGTHS.unsqueeze(1)).float()


def group_ids() -> torch.Tensor:
    return torch.arange(LENGTHS.numel()) // N


def logprobs(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return -torch.rand(LENGTHS.numel(), T, generator=generator, dtype=torch.float64) * 3


# ------------------------------------------------------------------------------------------ tests


def test_last_token_mask_marks_the_last_valid_token():
    last = last_token_mask(response_mask())
    assert last.sum(dim=-1).tolist() == [1] * LENGTHS.numel()
    assert last.float().argmax(dim=-1).tolist() == (LENGTHS - 1).tolist()
    assert not last_token_mask(torch.zeros(2, 3)).any()


@pytest.mark.parametrize("norm", ["batch_norm", "none"])
def test_token_scores_match_verl(norm):
    rm, ref, mask = logprobs(1), logprobs(2), response_mask()
    expected_scores, expected_q = verl_token_scores(rm.clone(), ref.clone(), LENGTHS, beta=0.05, prime_norm=norm)
    q = implicit_log_ratio(rm_logprobs=rm, ref_logprobs=ref, response_mask=mask)
    assert_close(q, expected_q)
    assert_close(implicit_token_scores(q, mask, beta=0.05, granularity="token", norm=norm), expected_scores)


def test_whole_granularity_puts_the_summed_reward_on_the_last_token():
    rm, ref, mask = logprobs(1), logprobs(2), response_mask()
    q = implicit_log_ratio(rm_logprobs=rm, ref_logprobs=ref, response_mask=mask)
    scores = implicit_token_scores(q, mask, beta=0.5, granularity="whole", norm="none")
    assert_close(scores.sum(dim=-1), (q * 0.5).sum(dim=-1))
    assert (scores != 0).sum(dim=-1).tolist() == [1] * LENGTHS.numel()
    with pytest.raises(ValueError, match="prime_granularity"):
        implicit_token_scores(q, mask, beta=0.5, granularity="step")


def test_ce_loss_matches_verl_and_its_gradient():
    mask = response_mask()
    acc = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    rm = logprobs(3).requires_grad_()
    rm_verl = rm.detach().clone().requires_grad_()
    ref = logprobs(4)
    ours = implicit_prm_ce_loss(implicit_log_ratio(rm_logprobs=rm, ref_logprobs=ref, response_mask=mask), acc, mask,
                                beta=0.05)
    theirs = verl_compute_ce_dpo_loss_rm((rm_verl - ref) * mask, acc, mask, beta=0.05)
    assert_close(ours, theirs)
    ours.backward()
    theirs.backward()
    assert_close(rm.grad, rm_verl.grad)
    assert rm.grad[mask == 0].abs().sum() == 0


@pytest.mark.parametrize("dpo_coef,gt_coef", [(5.0, 5.0), (5.0, 0.0), (0.0, 5.0), (1.0, 3.0)])
def test_rloo_advantages_match_verl(dpo_coef, gt_coef):
    mask = response_mask()
    q = implicit_log_ratio(rm_logprobs=logprobs(5), ref_logprobs=logprobs(6), response_mask=mask)
    scores = implicit_token_scores(q, mask, beta=0.05).float()
    acc = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    prompts = torch.zeros(LENGTHS.numel(), 3, dtype=torch.long)
    batch = {"rm_scores": scores, "acc": acc, "prompts": prompts,
             "attention_mask": torch.cat([torch.ones(LENGTHS.numel(), 3), mask], dim=-1).long()}
    expected_adv, expected_ret = verl_compute_rloo_advantage_return(batch, mask, N, dpo_coef, gt_coef)
    advantages, returns = prime_rloo_advantages(token_scores=scores, acc=acc, response_mask=mask,
                                                group_ids=group_ids(), reward_dpo_coef=dpo_coef,
                                                reward_gt_coef=gt_coef)
    assert_close(returns, expected_ret)
    valid = mask.bool()
    assert_close(advantages[valid], expected_adv[valid])
    assert (advantages[~valid] == 0).all()


def test_rloo_groups_by_id_not_by_position():
    """Rows of a group need not be consecutive: shuffling the rows shuffles the result."""
    mask = response_mask()
    scores = implicit_token_scores(implicit_log_ratio(rm_logprobs=logprobs(7), ref_logprobs=logprobs(8),
                                                      response_mask=mask), mask, beta=0.05).float()
    acc = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    kwargs = dict(reward_dpo_coef=5.0, reward_gt_coef=5.0)
    advantages, returns = prime_rloo_advantages(token_scores=scores, acc=acc, response_mask=mask,
                                                group_ids=group_ids(), **kwargs)
    perm = torch.tensor([3, 6, 0, 5, 1, 7, 2, 4])
    shuffled = prime_rloo_advantages(token_scores=scores[perm], acc=acc[perm], response_mask=mask[perm],
                                     group_ids=group_ids()[perm], **kwargs)
    assert_close(shuffled[0], advantages[perm])
    assert_close(shuffled[1], returns[perm])


def test_dpo_accuracy_metrics_match_verl():
    mask = response_mask()
    scores = implicit_token_scores(implicit_log_ratio(rm_logprobs=logprobs(9), ref_logprobs=logprobs(10),
                                                      response_mask=mask), mask, beta=0.05).float()
    for acc in (torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]),
                torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.5, 1.0, 0.0])):  # first group: equal outcomes -> 0.5
        assert_close(dpo_accuracy(scores, acc, mask, group_ids()), verl_compute_dpo_accuracy(scores, acc, mask, N))
        assert_close(dpo_abs_accuracy(scores, acc, mask), verl_compute_dpo_abs_accuracy(scores, acc, mask, N))


@pytest.mark.parametrize("filter_accuracy,filter_truncate", [(True, True), (True, False), (False, True)])
def test_group_filter_matches_verl(filter_accuracy, filter_truncate):
    n, groups = 4, 6
    acc = torch.tensor([1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 1, 0, 1, 0, 1, 0, 0, 0], dtype=torch.float32)
    lengths = torch.tensor([3, 4, 9, 2, 5, 5, 5, 5, 1, 1, 1, 1, 9, 2, 2, 2, 3, 3, 3, 3, 8, 2, 2, 2])
    ids = torch.arange(n * groups) // n
    expected = verl_filter_mask(acc.tolist(), lengths, n, filter_accuracy, 0.2, 0.8, filter_truncate, 10)
    ours = group_filter_mask(acc=acc, response_lengths=lengths, group_ids=ids, filter_accuracy=filter_accuracy,
                             lower=0.2, upper=0.8, filter_truncate=filter_truncate, max_response_length=10)
    assert ours.tolist() == expected.repeat_interleave(n).tolist()


def test_prioritised_keep_takes_passing_groups_first_in_order():
    n = 2
    ids = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    passes = torch.tensor([False, False, True, True, False, False, True, True])
    assert prioritised_keep(passes, ids, keep_groups=2, n=n).tolist() == [2, 3, 6, 7]
    assert prioritised_keep(passes, ids, keep_groups=3, n=n).tolist() == [2, 3, 6, 7, 0, 1]
    # groups given out of order keep their rows together
    ids = torch.tensor([1, 0, 1, 0])
    passes = torch.tensor([True, False, True, False])
    assert prioritised_keep(passes, ids, keep_groups=1, n=2).tolist() == [0, 2]
