"""The hf rollout engine on tiny models (pad == end of turn, as in SmolLM2)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from npu_rl.models.loader import load_causal_lm, load_tokenizer
from npu_rl.rollout import SamplingParams
from npu_rl.rollout.hf import HFRolloutEngine, warp_logits
from npu_rl.rollout.utils import left_padded_prompts
from tests.rollout.conftest import make_prompts

EOS = 2


@pytest.fixture(scope="module")
def tiny(tiny_model_dir_pad_is_eos):
    tokenizer = load_tokenizer(tiny_model_dir_pad_is_eos)
    return load_causal_lm(tiny_model_dir_pad_is_eos), tokenizer


@pytest.fixture(scope="module")
def eos_model(eos_model_dir):
    return load_causal_lm(eos_model_dir), load_tokenizer(eos_model_dir)


def greedy(n=1, max_new_tokens=12, logprobs=True) -> SamplingParams:
    return SamplingParams(n=n, do_sample=False, max_new_tokens=max_new_tokens, stop_token_ids=[EOS],
                          return_logprobs=logprobs)


def manual_logprobs(model, out, temperature=1.0, top_k=-1, top_p=1.0) -> torch.Tensor:
    """Log-probs of the responses from one full forward pass over prompt + response. [N, R]"""
    prompt_length = out["prompts"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=out["input_ids"], attention_mask=out["attention_mask"],
                       position_ids=out["position_ids"]).logits.float()
    logits = logits[:, prompt_length - 1:-1]  # the logits that predicted each response token
    warped = warp_logits(logits.flatten(0, 1), temperature, top_k, top_p).view_as(logits)
    return torch.log_softmax(warped, -1).gather(-1, out["responses"].unsqueeze(-1)).squeeze(-1)


def test_samples_are_interleaved_and_fields_complete(tiny):
    model, tokenizer = tiny
    prompts = make_prompts(tokenizer, ["hello", "hi there friend"], chat=True)
    sampling = SamplingParams(n=3, temperature=1.0, max_new_tokens=10, stop_token_ids=[EOS], return_logprobs=True)
    out = HFRolloutEngine(model, tokenizer.pad_token_id).generate(prompts, sampling).batch
    num_prompt_tokens = prompts["input_ids"].shape[1]
    assert out["uid"].tolist() == ["p0"] * 3 + ["p1"] * 3 and out.meta == {"step": 3}
    assert torch.equal(out["prompts"], prompts["input_ids"].repeat_interleave(3, 0))
    assert out["responses"].shape == out["response_mask"].shape == out["rollout_logprobs"].shape == (6, 10)
    assert torch.equal(out["input_ids"][:, num_prompt_tokens:], out["responses"])
    assert torch.equal(out["attention_mask"][:, num_prompt_tokens:], out["response_mask"])
    # The left padding of the shorter prompt (p0) is id 2 too; it must stay out of the attention mask.
    assert (out["prompts"][:3, 0] == EOS).all() and (out["attention_mask"][:3, 0] == 0).all()


def test_greedy_is_deterministic_and_identical_across_n(tiny):
    model, tokenizer = tiny
    engine = HFRolloutEngine(model, tokenizer.pad_token_id)
    prompts = make_prompts(tokenizer)
    first, second = engine.generate(prompts, greedy(n=2)).batch, engine.generate(prompts, greedy(n=2)).batch
    assert torch.equal(first["responses"], second["responses"])
    assert torch.equal(first["responses"][0::2], first["responses"][1::2])


def test_mask_ends_at_the_first_end_token_when_pad_is_eos(eos_model):
    model, tokenizer = eos_model
    out = HFRolloutEngine(model, tokenizer.pad_token_id).generate(make_prompts(tokenizer), greedy(max_new_tokens=16)).batch
    responses, mask = out["responses"], out["response_mask"].bool()
    lengths = mask.sum(-1)
    # The fixture's model stops at once, after a few tokens, and never: all three cases are here.
    assert (lengths == 1).any() and ((lengths > 1) & (lengths < 16)).any() and (lengths == 16).any()
    for row, length in zip(responses, lengths.tolist()):
        stops = (row == EOS).nonzero().flatten().tolist()
        if length < 16:
            assert stops[0] == length - 1  # the end token itself is the last masked-in token
        assert (row[length:] == tokenizer.pad_token_id).all()
        assert EOS not in row[: max(length - 1, 0)].tolist()


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, -1, 1.0), (0.7, -1, 1.0), (0.8, 20, 0.9)])
def test_rollout_logprobs_match_a_manual_forward(eos_model, temperature, top_k, top_p):
    model, tokenizer = eos_model
    torch.manual_seed(0)
    sampling = SamplingParams(n=2, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=12,
                              stop_token_ids=[EOS], return_logprobs=True)
    out = HFRolloutEngine(model, tokenizer.pad_token_id).generate(make_prompts(tokenizer), sampling).batch
    mask = out["response_mask"].bool()
    expected = manual_logprobs(model, out, temperature, top_k, top_p)
    assert_close(out["rollout_logprobs"][mask], expected[mask])  # float32 defaults: rtol 1.3e-6, atol 1e-5
    assert (out["rollout_logprobs"][~mask] == 0).all()


def test_greedy_logprobs_are_unscaled(eos_model):
    model, tokenizer = eos_model
    out = HFRolloutEngine(model, tokenizer.pad_token_id).generate(make_prompts(tokenizer), greedy()).batch
    mask = out["response_mask"].bool()
    assert_close(out["rollout_logprobs"][mask], manual_logprobs(model, out)[mask])


def test_outputs_can_be_trained_on_and_train_mode_is_restored(tiny):
    model, tokenizer = tiny
    model.train()
    out = HFRolloutEngine(model, tokenizer.pad_token_id).generate(make_prompts(tokenizer), greedy(logprobs=False)).batch
    assert model.training and not out["input_ids"].is_inference()
    logits = model(input_ids=out["input_ids"], attention_mask=out["attention_mask"]).logits
    logits.float().mean().backward()  # fails on inference tensors (the reason for no_grad over inference_mode)
    assert model.model.embed_tokens.weight.grad is not None
    model.zero_grad(set_to_none=True)
    model.eval()


def test_shared_module_needs_no_sync_and_never_reads_the_stream(tiny):
    model, tokenizer = tiny
    engine = HFRolloutEngine(model, tokenizer.pad_token_id, shares_actor_module=True)

    def exploding():
        raise AssertionError("the stream was read")
        yield  # pragma: no cover

    assert engine.needs_weight_sync is False
    assert engine.update_weights(exploding(), version=1) == {}


def test_own_copy_takes_new_weights(eos_model_dir, eos_model_dir_other_weights):
    tokenizer = load_tokenizer(eos_model_dir)
    prompts = make_prompts(tokenizer)
    engine = HFRolloutEngine.from_pretrained(eos_model_dir, tokenizer.pad_token_id, dtype="fp32", device="cpu",
                                             bucket_megabytes=0.05)
    reference = HFRolloutEngine.from_pretrained(eos_model_dir_other_weights, tokenizer.pad_token_id, dtype="fp32",
                                                device="cpu")
    before = engine.generate(prompts, greedy()).batch
    new_weights = load_causal_lm(eos_model_dir_other_weights).state_dict()
    metrics = engine.update_weights(iter(new_weights.items()), version=5)
    assert metrics["rollout/update_weights_buckets"] > 1
    after, expected = engine.generate(prompts, greedy()).batch, reference.generate(prompts, greedy()).batch
    assert not torch.equal(before["responses"], after["responses"])
    assert torch.equal(after["responses"], expected["responses"])
    assert engine.update_weights(iter([("not.a.weight", torch.zeros(1))]), version=5) == {}  # same version: skip
    with pytest.raises(KeyError, match="lm_head.weight"):
        engine.update_weights(iter([("lm_head.weights", torch.zeros(1))]), version=6)


def test_sleep_wake_round_trip(tiny):
    model, tokenizer = tiny
    engine = HFRolloutEngine(model, tokenizer.pad_token_id)
    prompts = make_prompts(tokenizer)
    before = engine.generate(prompts, greedy()).batch
    metrics = engine.sleep()
    assert {"timing_s/rollout_sleep", "rollout/sleep_mem_freed_gb"} <= set(metrics)
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(prompts, greedy()).batch
    assert engine.sleep() == {}  # already asleep
    assert "timing_s/rollout_wake" in engine.wake_up()
    assert torch.equal(engine.generate(prompts, greedy()).batch["responses"], before["responses"])


def test_model_folder_sampling_defaults_do_not_leak(eos_model_dir):
    model, tokenizer = load_causal_lm(eos_model_dir), load_tokenizer(eos_model_dir)
    model.generation_config.top_k, model.generation_config.repetition_penalty = 1, 1.5  # like Qwen's top_k=20 ...
    torch.manual_seed(0)
    sampling = SamplingParams(n=4, max_new_tokens=8, stop_token_ids=[EOS], return_logprobs=True)
    out = HFRolloutEngine(model, tokenizer.pad_token_id).generate(make_prompts(tokenizer, ["hi there friend"]), sampling).batch
    assert len({tuple(row.tolist()) for row in out["responses"]}) > 1  # top_k=1 would make all four samples equal
    mask = out["response_mask"].bool()
    assert_close(out["rollout_logprobs"][mask], manual_logprobs(model, out)[mask])  # no penalty, no top-k


def test_compiled_decode_path_gives_the_eager_tokens_and_logprobs(eos_model):
    """The static KV cache that compiled decoding uses (compiled on CUDA; on CPU transformers runs it eagerly):
    same tokens, same masks, log-probs equal to a full forward, as the dynamic cache gives."""
    model, tokenizer = eos_model
    prompts = make_prompts(tokenizer)
    eager = HFRolloutEngine(model, tokenizer.pad_token_id).generate(prompts, greedy(max_new_tokens=16)).batch
    engine = HFRolloutEngine(model, tokenizer.pad_token_id, compiled_decode=True)
    generated = engine.generate(prompts, greedy(max_new_tokens=16))
    static = generated.batch
    assert generated.metrics["rollout/decode_compiled"] == 1.0
    assert torch.equal(static["responses"], eager["responses"])
    assert torch.equal(static["response_mask"], eager["response_mask"])
    mask = static["response_mask"].bool()
    assert_close(static["rollout_logprobs"][mask], manual_logprobs(model, static)[mask], rtol=1e-5, atol=1e-4)
    torch.manual_seed(0)  # sampling: log-probs of the warped distribution, as on the eager path
    sampling = SamplingParams(n=2, temperature=0.8, top_k=20, top_p=0.9, max_new_tokens=12, stop_token_ids=[EOS],
                              return_logprobs=True)
    out = engine.generate(prompts, sampling).batch
    mask = out["response_mask"].bool()
    assert_close(out["rollout_logprobs"][mask], manual_logprobs(model, out, 0.8, 20, 0.9)[mask], rtol=1e-5,
                 atol=1e-4)


def test_compiled_decode_stays_off_where_it_is_not_verified(eos_model):
    model, tokenizer = eos_model
    assert not HFRolloutEngine(model, tokenizer.pad_token_id)._compiles(model)  # not asked for
    own_cache = HFRolloutEngine(model, tokenizer.pad_token_id, compiled_decode=True,
                                generate_kwargs={"cache_implementation": "dynamic"})
    assert not own_cache._compiles(model)  # rollout.engine_kwargs.hf chose a cache
    from peft import LoraConfig, get_peft_model

    import copy

    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, target_modules=["q_proj"]))
    assert not HFRolloutEngine(peft_model, tokenizer.pad_token_id, compiled_decode=True)._compiles(peft_model)


def test_device_layer_chooses_compiled_decode(monkeypatch):
    from npu_rl.device.backend import Backend, make_backend

    monkeypatch.delenv("NPU_RL_COMPILED_DECODE", raising=False)
    assert make_backend("cuda").compiled_decode and not make_backend("cpu").compiled_decode
    assert not Backend("npu", "hccl", None, "NPU").compiled_decode  # transformers' generate does not use torchair
    monkeypatch.setenv("NPU_RL_COMPILED_DECODE", "0")
    assert not make_backend("cuda").compiled_decode
    monkeypatch.setenv("NPU_RL_COMPILED_DECODE", "1")
    assert make_backend("cpu").compiled_decode


def test_token_lists_take_a_budget_each_and_match_one_prompt_generations(eos_model):
    """The agent loops' path: requests of different lengths in one call, each cut to its own budget; greedy, each
    equals generating that prompt alone (up to its budget), and the metrics come back with the call."""
    model, tokenizer = eos_model
    engine = HFRolloutEngine(model, tokenizer.pad_token_id)
    token_lists = [tokenizer.encode(t, add_special_tokens=False) for t in ("hello there", "x", "what is 2+3? ok")]
    budgets = [3, 12, 7]
    turn = engine.generate_token_lists(token_lists, budgets, greedy(max_new_tokens=1))
    assert turn.metrics["timing_s/rollout_decode"] > 0
    for ids, budget, completion in zip(token_lists, budgets, turn.completions):
        alone = engine.generate(left_padded_prompts([ids], tokenizer.pad_token_id), greedy(max_new_tokens=budget)).batch
        want = alone["responses"][0][alone["response_mask"][0].bool()].tolist()
        assert completion.token_ids == want and len(completion.token_ids) <= budget
        assert EOS not in completion.token_ids[:-1] and len(completion.logprobs) == len(completion.token_ids)
    with pytest.raises(ValueError, match="3 requests but 2 budgets"):
        engine.generate_token_lists(token_lists, budgets[:2], greedy())


def test_compiled_decode_only_for_runs_long_enough_to_pay(monkeypatch):
    from npu_rl.rollout.factory import COMPILE_MIN_DECODE_STEPS, compiled_decode_pays

    monkeypatch.delenv("NPU_RL_COMPILED_DECODE", raising=False)
    assert not compiled_decode_pays(15 * 24)  # the embedded default: 15 steps x 24 tokens
    assert compiled_decode_pays(COMPILE_MIN_DECODE_STEPS) and compiled_decode_pays(None)  # None: length unknown
    monkeypatch.setenv("NPU_RL_COMPILED_DECODE", "1")
    assert compiled_decode_pays(1)


def test_factory_builds_an_eager_hf_engine_for_a_short_run(monkeypatch, eos_model, eos_model_dir):
    from npu_rl.config.schema import RolloutConfig
    from npu_rl.device import backend as backend_module
    from npu_rl.rollout.factory import build_rollout_engine

    model, tokenizer = eos_model
    monkeypatch.delenv("NPU_RL_COMPILED_DECODE", raising=False)
    cuda_like = backend_module.make_backend("cuda")
    monkeypatch.setattr(backend_module, "_BACKEND", cuda_like)  # what get_backend() returns, wherever it is imported
    config = RolloutConfig(name="hf")
    short = build_rollout_engine(config, eos_model_dir, model, tokenizer, decode_steps=15 * 24)
    long = build_rollout_engine(config, eos_model_dir, model, tokenizer, decode_steps=200 * 256)
    assert not short.compiled_decode and long.compiled_decode


def test_an_moe_model_asking_for_router_logits_generates():
    """``output_router_logits=True`` (the auxiliary loss in training) made every decode step compute transformers'
    load-balancing loss against the whole attention mask, which fails with left padding (found on the H200): the
    engine generates without it, and the tokens equal those of the same model not asking."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from npu_rl.models.synthetic import char_tokenizer

    tokenizer = char_tokenizer()
    config = AutoConfig.for_model("qwen3_moe", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                  num_experts=8, num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=2,
                                  head_dim=16, num_hidden_layers=2, vocab_size=len(tokenizer),
                                  output_router_logits=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    prompts = make_prompts(tokenizer)
    assert prompts["attention_mask"].min() == 0  # left padding: what failed
    asking = HFRolloutEngine(model, tokenizer.pad_token_id).generate(prompts, greedy(max_new_tokens=6)).batch
    model.config.output_router_logits = False
    plain = HFRolloutEngine(model, tokenizer.pad_token_id).generate(prompts, greedy(max_new_tokens=6)).batch
    assert torch.equal(asking["responses"], plain["responses"])
