"""Token balancing: Karmarkar-Karp, token-budget micro-batches, and balance_batch across DP ranks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from npu_rl.parallel import (
    balance_batch,
    karmarkar_karp,
    partition_by_token_budget,
    restore_order,
    split_by_token_budget,
)
from npu_rl.protocol import Batch
from tests.parallel.common import tiny_model


def mask_of(lengths: list[int], seq_len: int = 16) -> torch.Tensor:
    return (torch.arange(seq_len)[None, :] < torch.tensor(lengths)[:, None]).long()


def test_karmarkar_karp_by_hand():
    # LDM on 8 7 6 5 4: 8-7=1, 6-5=1, 4-1=3, 3-1=2 -> sums 16 and 14 (the optimum 15/15 is out of its reach).
    parts = karmarkar_karp([8, 7, 6, 5, 4], 2)
    assert sorted(sum([8, 7, 6, 5, 4][i] for i in p) for p in parts) == [14, 16]
    assert sorted(i for p in parts for i in p) == [0, 1, 2, 3, 4]
    # equal_size: 1..8 in 2 parts of 4 -> 18 / 18.
    parts = karmarkar_karp(list(range(1, 9)), 2, equal_size=True)
    assert [len(p) for p in parts] == [4, 4] and [sum(i + 1 for i in p) for p in parts] == [18, 18]
    with pytest.raises(ValueError, match="equal_size"):
        karmarkar_karp([1, 2, 3], 2, equal_size=True)
    assert karmarkar_karp([5], 3) == [[0], [], []]


def test_token_budget_is_respected_and_order_restored():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 17, (23,), generator=gen).tolist()
    batch = Batch({"attention_mask": mask_of(lengths), "row": torch.arange(23)}, {"uid": [f"u{i}" for i in range(23)]})
    micro_batches, parts = split_by_token_budget(batch, max_token_len=40)
    sums = [int(mb["attention_mask"].sum()) for mb in micro_batches]
    assert max(sums) <= 40
    assert len(micro_batches) >= -(-sum(lengths) // 40)  # at least the lower bound
    assert sorted(i for p in parts for i in p) == list(range(23))
    restored = restore_order([mb["row"] * 10 for mb in micro_batches], parts)
    assert restored.tolist() == [i * 10 for i in range(23)]
    assert restore_order(micro_batches, parts)["uid"].tolist() == batch["uid"].tolist()


def test_budget_errors_and_rank_agreement():
    with pytest.raises(ValueError, match="more than the token budget 10"):
        partition_by_token_budget([4, 11], 10)
    # Another rank needs 4 micro-batches: this one follows, still within the budget.
    parts = partition_by_token_budget([5, 5, 5, 5, 5], 20, sync_max=lambda k: max(k, 4))
    assert len(parts) == 4 and all(sum(5 for _ in p) <= 20 for p in parts)
    with pytest.raises(ValueError, match="same number of rows"):
        partition_by_token_budget([5, 5], 20, sync_max=lambda k: 3)


def test_dynamic_micro_batches_give_the_same_summed_gradient():
    gen = torch.Generator().manual_seed(3)
    lengths = torch.randint(3, 17, (8,), generator=gen).tolist()
    batch = Batch({"input_ids": torch.randint(3, 128, (8, 16), generator=gen), "attention_mask": mask_of(lengths)})
    valid_total = sum(n - 1 for n in lengths)  # predicted tokens in the whole mini-batch

    def accumulate(model, micro_batches):
        for mb in micro_batches:  # token-mean over the mini-batch: each micro-batch divides by the global count
            logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits
            valid = (mb["attention_mask"] * torch.roll(mb["attention_mask"], -1, 1)).bool()
            valid[:, -1] = False
            nll = F.cross_entropy(logits.transpose(1, 2), torch.roll(mb["input_ids"], -1, 1), reduction="none")
            ((nll * valid).sum() / valid_total).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    fixed = accumulate(tiny_model(), batch.split(2))
    dynamic_batches, _ = split_by_token_budget(batch, max_token_len=32)
    assert len(dynamic_batches) != 4  # a genuinely different split
    dynamic = accumulate(tiny_model(), dynamic_batches)
    for name, grad in fixed.items():
        torch.testing.assert_close(dynamic[name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_balance_batch_metrics_by_hand():
    # 4 rows of 10, 9, 1, 2 tokens over 2 dp ranks. Before: rank 0 gets rows 0-1 (19), rank 1 rows 2-3 (3).
    # KK on equal-size pairs: {10, 9} and {2, 1} merge heaviest-with-lightest -> {10, 1} and {9, 2}: 11 / 11.
    batch = Batch({"attention_mask": mask_of([10, 9, 1, 2]), "row": torch.arange(4)})
    balanced, metrics = balance_batch(batch, dp_size=2)
    assert metrics == {"global_seqlen/min": 3, "global_seqlen/max": 19, "global_seqlen/minmax_diff": 16,
                       "global_seqlen/balanced_min": 11, "global_seqlen/balanced_max": 11}
    assert balanced["row"].tolist() == [0, 2, 1, 3]
    assert [int(c["attention_mask"].sum()) for c in balanced.chunk(2)] == [11, 11]
    with pytest.raises(ValueError, match="cannot be split evenly"):
        balance_batch(batch.index(slice(0, 3)), dp_size=2)
