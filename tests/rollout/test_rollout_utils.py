"""Pure helpers of the rollout package: masks, output assembly, mismatch metrics, warping, weight buckets, settings."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from npu_rl.config.schema import RolloutConfig, ValKwargsConfig
from npu_rl.protocol import Batch
from npu_rl.rollout import first_stop_response_mask, rollout_probs_diff_metrics, sampling_params_from_config
from npu_rl.rollout.hf import warp_logits
from npu_rl.rollout.utils import assemble_rollout_batch
from npu_rl.rollout.weights import SyncStats, VersionGate, bucketed, flatten, with_tied_lm_head

PAD = EOS = 2  # SmolLM2: pad and end of turn share an id


def test_mask_ends_at_first_stop_when_pad_is_eos():
    responses = torch.tensor([[5, EOS, PAD, PAD],   # stop at 1, then padding that looks like more stops
                              [EOS, 7, EOS, PAD],   # stops at once; the later 7 is not part of the response
                              [5, 6, 7, 8]])        # never stops: all four tokens count
    mask = first_stop_response_mask(responses, [EOS])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]


def test_mask_respects_lengths_and_several_stop_ids():
    responses = torch.tensor([[5, 6, 7, 8], [5, 7, 9, 9]])
    # Row 0 generated 2 tokens (the rest is filler), row 1 stops at the second stop id (7), inclusive.
    mask = first_stop_response_mask(responses, [EOS, 7], lengths=torch.tensor([2, 4]))
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 0, 0]]
    assert first_stop_response_mask(responses, []).all()


def test_assemble_interleaves_rows_and_continues_positions():
    prompts = Batch({"input_ids": torch.tensor([[0, 0, 5], [4, 5, 6]]),
                     "attention_mask": torch.tensor([[0, 0, 1], [1, 1, 1]])},
                    {"uid": ["a", "b"]}, {"step": 7})
    responses = torch.tensor([[9, EOS, 9], [9, 9, 9], [EOS, 9, 9], [9, 9, EOS]])
    mask = first_stop_response_mask(responses, [EOS])
    out = assemble_rollout_batch(prompts, responses, mask, n=2, pad_token_id=PAD,
                                 rollout_logprobs=torch.full((4, 3), -1.0))
    assert out["uid"].tolist() == ["a", "a", "b", "b"] and out.meta == {"step": 7}
    assert out["prompts"].tolist() == [[0, 0, 5], [0, 0, 5], [4, 5, 6], [4, 5, 6]]
    # After the first stop: pad ids, mask 0, log-prob 0.
    assert out["responses"].tolist() == [[9, EOS, PAD], [9, 9, 9], [EOS, PAD, PAD], [9, 9, EOS]]
    assert out["response_mask"].tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]]
    assert out["rollout_logprobs"].tolist()[2] == [-1.0, 0.0, 0.0]
    # Prompt "a" has one real token (position 0): responses take 1, 2, 3; prompt "b" ends at 2: 3, 4, 5.
    assert out["position_ids"].tolist()[0] == [0, 0, 0, 1, 2, 3]
    assert out["position_ids"].tolist()[2] == [0, 1, 2, 3, 4, 5]
    assert out["input_ids"].shape == (4, 6) and out["attention_mask"][:, 3:].tolist() == out["response_mask"].tolist()


def test_rollout_probs_diff_metrics_by_hand():
    rollout = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    actor = torch.log(torch.tensor([[0.4, 0.2, 0.0001]]))
    mask = torch.tensor([[1, 1, 0]])  # the 0.9 vs 0.0001 position is not a response token
    metrics = rollout_probs_diff_metrics(rollout, actor, mask)
    # |diffs| on the response = [0.1, 0.0]: mean 0.05, max 0.1, unbiased std sqrt((0.05^2 + 0.05^2) / 1)
    assert all(v.dim() == 0 for v in metrics.values())
    assert_close(metrics["training/rollout_probs_diff_mean"], torch.tensor(0.05))
    assert_close(metrics["training/rollout_probs_diff_max"], torch.tensor(0.1))
    assert_close(metrics["training/rollout_probs_diff_std"], torch.tensor(math.sqrt(2 * 0.05**2)))


def test_warp_logits_top_k_and_top_p_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top2 = warp_logits(logits, temperature=1.0, top_k=2, top_p=1.0)
    assert torch.isinf(top2[0, 2:]).all() and torch.isfinite(top2[0, :2]).all()
    # Ascending cumulative mass: 0.05, 0.20, 0.50, 1.00; top_p=0.8 drops the tokens whose cumsum <= 0.2.
    nucleus = warp_logits(logits, temperature=1.0, top_k=-1, top_p=0.8)
    assert torch.isfinite(nucleus).tolist() == [[True, True, False, False]]
    # Temperature 0.5 squares the odds: p ~ [0.25, 0.09, ...] / sum.
    hot = torch.softmax(warp_logits(logits, temperature=0.5, top_k=-1, top_p=1.0), -1)
    expected = torch.tensor([0.25, 0.09, 0.0225, 0.0025]) / 0.365
    assert_close(hot[0], expected)


def test_sampling_params_training_vs_validation():
    config = RolloutConfig(n=4, temperature=0.9, top_p=0.95, top_k=0,
                           val_kwargs=ValKwargsConfig(n=2, temperature=0.0, do_sample=False))
    train = sampling_params_from_config(config, validate=False, max_new_tokens=32, stop_ids=[2, 5], logprobs=True)
    assert (train.n, train.temperature, train.top_p, train.top_k, train.greedy) == (4, 0.9, 0.95, -1, False)
    assert train.stop_token_ids == [2, 5] and train.return_logprobs and train.max_new_tokens == 32
    val = sampling_params_from_config(config, validate=True, max_new_tokens=16, stop_ids=[2], logprobs=False)
    assert (val.n, val.greedy, val.return_logprobs) == (2, True, False)
    config.ignore_eos = True
    assert sampling_params_from_config(config, validate=False, max_new_tokens=8, stop_ids=[2],
                                       logprobs=False).stop_token_ids == []


def test_buckets_hold_about_the_configured_size_and_convert():
    one_mb_fp32 = 2**18  # elements
    tensors = [(f"w{i}", torch.ones(one_mb_fp32)) for i in range(5)]
    stats = SyncStats()
    buckets = list(bucketed(iter(tensors), bucket_megabytes=1.0, stats=stats, dtype=torch.bfloat16))
    # 1 MiB fp32 each: a bucket fills at 1 MiB, so each tensor travels alone; converted to bf16 (0.5 MiB).
    assert [len(b) for b in buckets] == [1, 1, 1, 1, 1] and buckets[0][0][1].dtype == torch.bfloat16
    stats = SyncStats()
    buckets = list(bucketed(iter(tensors), bucket_megabytes=2.5, stats=stats))
    assert [len(b) for b in buckets] == [2, 2, 1] and stats.num_bytes == 5 * 2**20 and stats.num_buckets == 3
    assert [name for name, _ in flatten(iter(buckets))] == [f"w{i}" for i in range(5)]
    with pytest.raises(ValueError, match="positive"):
        list(bucketed(iter(tensors), bucket_megabytes=0, stats=SyncStats()))


def test_buckets_pull_the_source_lazily():
    pulled = []

    def source():
        for i in range(4):
            pulled.append(i)
            yield f"w{i}", torch.ones(2**18)

    stream = bucketed(source(), bucket_megabytes=1.0, stats=SyncStats())
    next(stream)
    assert pulled == [0, 1]  # the second tensor is read to learn that the first bucket is full, no more


def test_version_gate():
    gate = VersionGate()
    assert not gate.is_current(3) and not gate.is_current(None)
    gate.mark(3)
    assert gate.is_current(3) and not gate.is_current(4) and not gate.is_current(None)


def test_tied_embedding_is_also_sent_as_the_lm_head():
    embed, norm = torch.ones(2), torch.zeros(2)
    stream = list(with_tied_lm_head(iter([("model.embed_tokens.weight", embed), ("model.norm.weight", norm)])))
    assert [name for name, _ in stream] == ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
    assert stream[1][1] is embed  # the same tensor, no copy
    nested = list(with_tied_lm_head(iter([("language_model.model.embed_tokens.weight", embed)])))
    assert nested[1][0] == "language_model.lm_head.weight"
    # a Qwen-VL model's transformers-5 names: the head is the top-level lm_head (not "model.language_lm_head")
    vl = list(with_tied_lm_head(iter([("model.language_model.embed_tokens.weight", embed)])))
    assert [name for name, _ in vl] == ["model.language_model.embed_tokens.weight", "lm_head.weight"]
