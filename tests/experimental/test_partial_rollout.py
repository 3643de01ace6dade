"""Partial rollouts: a generation interrupted and then continued from its held tokens gives the tokens and log-probs
of one that ran without a break, when the weights did not change (hf engine, tiny random model, float32)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from npu_rl.models.loader import load_tokenizer
from npu_rl.protocol import Batch
from npu_rl.rollout import SamplingParams
from npu_rl.rollout.hf import HFRolloutEngine
from npu_rl.rollout.partial import (continue_rows, merge_continuation, response_lengths, scatter_rows,
                                    unfinished_rows)
from tests.rollout.conftest import make_prompts, save_eos_model_dir

EOS = 2


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = save_eos_model_dir(str(tmp_path_factory.mktemp("eos_model_partial")))
    tokenizer = load_tokenizer(folder)
    return HFRolloutEngine.from_pretrained(folder, tokenizer.pad_token_id, dtype="fp32", device="cpu"), tokenizer


def stop_after(calls: int):
    """should_stop that turns true at its ``calls``-th check (the engine checks once per decode step)."""
    seen = [0]

    def should_stop() -> bool:
        seen[0] += 1
        return seen[0] >= calls
    return should_stop


def resume(engine, rows: Batch, sampling: SamplingParams, interrupts=()) -> Batch:
    """Continue the unfinished rows until none is left, interrupting the continuations at ``interrupts`` steps."""
    stops = list(interrupts)
    while True:
        todo = unfinished_rows(rows, sampling.stop_token_ids)
        if not bool(todo.any()):
            return rows
        index = torch.nonzero(todo).squeeze(1)
        stop = stop_after(stops.pop(0)) if stops else None
        merged = continue_rows(lambda p, s: engine.generate(p, s, should_stop=stop).batch, rows.index(index),
                               sampling, engine.pad_token_id)
        held = rows.index(index)
        kept = held["response_mask"].bool()
        assert torch.equal(merged["responses"][kept], held["responses"][kept])  # nothing regenerated
        assert torch.equal(merged["rollout_logprobs"][kept], held["rollout_logprobs"][kept])
        rows = scatter_rows(rows, index, merged)


def assert_same_rows(got: Batch, want: Batch) -> None:
    for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids", "prompts"):
        assert torch.equal(got[key], want[key]), key
    assert_close(got["rollout_logprobs"], want["rollout_logprobs"])  # prefill vs decode: float rounding only
    assert list(got["uid"]) == list(want["uid"])


@pytest.mark.parametrize("interrupts", [(4,), (1, 3, 2), (7, 1)])
def test_greedy_interrupted_and_resumed_equals_uninterrupted(engine, interrupts):
    engine, tokenizer = engine
    sampling = SamplingParams(n=2, do_sample=False, max_new_tokens=12, stop_token_ids=[EOS], return_logprobs=True)
    prompts = make_prompts(tokenizer)
    whole = engine.generate(prompts, sampling).batch
    part = engine.generate(prompts, sampling, should_stop=stop_after(interrupts[0])).batch
    todo = unfinished_rows(part, [EOS])
    lengths = response_lengths(part)
    assert bool(todo.any()) and not bool(todo.all())  # some rows had ended before the interrupt, some had not
    assert int(lengths[todo].max()) == interrupts[0]  # every unfinished row holds the tokens of the steps so far
    assert not bool(unfinished_rows(whole, [EOS]).any())
    assert_same_rows(resume(engine, part, sampling, interrupts[1:]), whole)


def test_seeded_sampling_interrupted_and_resumed_equals_uninterrupted(engine):
    """Sampling draws from torch's generator once per step for the whole batch: with no row ending early (no stop
    ids) the continuation draws for the same rows in the same order, so the seeded samples are the same."""
    engine, tokenizer = engine
    sampling = SamplingParams(n=2, temperature=0.9, top_k=20, top_p=0.95, max_new_tokens=10, stop_token_ids=[],
                              return_logprobs=True)
    prompts = make_prompts(tokenizer)
    torch.manual_seed(11)
    whole = engine.generate(prompts, sampling).batch
    torch.manual_seed(11)
    part = engine.generate(prompts, sampling, should_stop=stop_after(3)).batch
    assert bool(unfinished_rows(part, []).all()) and int(response_lengths(part).max()) == 3
    assert_same_rows(resume(engine, part, sampling), whole)


def test_merge_cuts_each_row_to_its_room_and_keeps_its_tokens():
    """Rows holding different numbers of tokens share one continuation call: each keeps its own tokens and takes only
    as many new ones as its response width has room for."""
    pad = 0
    rows = Batch({"prompts": torch.tensor([[0, 5], [6, 7]]), "responses": torch.tensor([[8, 9, 0, 0], [10, 0, 0, 0]]),
                  "response_mask": torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]]),
                  "attention_mask": torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]),
                  "input_ids": torch.tensor([[0, 5, 8, 9, 0, 0], [6, 7, 10, 0, 0, 0]]),
                  "position_ids": torch.tensor([[0, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5]]),
                  "rollout_logprobs": torch.tensor([[-1.0, -2.0, 0, 0], [-3.0, 0, 0, 0]])})
    # 3 new tokens each (the width left to the row holding fewest); the second row ends at its stop (id 2)
    continued = Batch({"responses": torch.tensor([[11, 12, 13], [14, 2, 0]]),
                       "response_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
                       "rollout_logprobs": torch.tensor([[-4.0, -5.0, -6.0], [-7.0, -8.0, 0.0]])})
    merged = merge_continuation(rows, continued, pad)
    assert merged["responses"].tolist() == [[8, 9, 11, 12], [10, 14, 2, 0]]
    assert merged["response_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert merged["rollout_logprobs"].tolist() == [[-1.0, -2.0, -4.0, -5.0], [-3.0, -7.0, -8.0, 0.0]]
    assert merged["input_ids"].tolist() == [[0, 5, 8, 9, 11, 12], [6, 7, 10, 14, 2, 0]]
    assert merged["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]]
    assert unfinished_rows(merged, [2]).tolist() == [False, False]  # full width; ended at the stop
    assert unfinished_rows(rows, [2]).tolist() == [True, True]
    assert unfinished_rows(replace_mask(rows), [2]).tolist() == [False, True]


def replace_mask(rows: Batch) -> Batch:
    """The first row ending at a stop token instead."""
    out = Batch(dict(rows.tensors))
    out["responses"] = torch.tensor([[8, 2, 0, 0], [10, 0, 0, 0]])
    return out


def test_segments_with_no_interrupt_give_the_whole_generation(engine):
    from npu_rl.rollout.partial import generate_in_segments

    engine, tokenizer = engine
    sampling = SamplingParams(n=2, do_sample=False, max_new_tokens=12, stop_token_ids=[EOS], return_logprobs=True)
    prompts = make_prompts(tokenizer)
    whole = engine.generate(prompts, sampling).batch
    calls = []

    def generate(p, s):
        calls.append(s.max_new_tokens)
        return engine.generate(p, s).batch
    assert_same_rows(generate_in_segments(generate, prompts, sampling, engine.pad_token_id, lambda: False), whole)
    assert calls[0] == 2 and len(calls) > 1  # 12 tokens in segments of ceil(12 / 8)
    stopped = generate_in_segments(lambda p, s: engine.generate(p, s).batch, prompts, sampling, engine.pad_token_id,
                                   stop_after(1))
    assert int(response_lengths(stopped).max()) == 2  # stopped after the first segment
    assert_same_rows(resume(engine, stopped, sampling), whole)


