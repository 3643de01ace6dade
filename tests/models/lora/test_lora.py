"""LoRA (npu_rl/models/lora.py) on the tiny model: targets, start-up errors, precision, the reference with the
adapter off, merged weights, a LoRA on lm_head through both log-prob kernels, checkpoints, merge round-trip."""

from __future__ import annotations

import os

import pytest
import torch

from npu_rl.models.forward import LogprobOptions, response_logprobs
from npu_rl.models.lora import (
    LoraConfigError,
    LoraSpec,
    adapter_disabled,
    addmm_lora_forward,
    apply_lora,
    lora_layers,
    merged_named_weights,
    resolve_target_modules,
    save_adapter,
)
from npu_rl.models.synthetic import random_causal_lm
from tests.models.lora.common import LORA, actor_batch, actor_config, actor_worker


def _randomize_b(model, seed: int = 1) -> None:
    """PEFT starts B at zero (adapter = identity); give it values so the adapter changes the outputs."""
    g = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            param.data.copy_(torch.randn(param.shape, generator=g) * 0.1)


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 100, (2, 12), generator=g)
    return ids, torch.ones_like(ids), torch.arange(12).expand(2, -1), ids[:, -5:]


def _logprobs(model, fused: bool = False) -> torch.Tensor:
    ids, mask, pos, responses = _inputs()
    options = LogprobOptions(use_fused_kernels=fused, fused_backend="torch")
    return response_logprobs(model, ids, mask, pos, responses, 1.0, options)[0]


def _reference_logprobs(model) -> torch.Tensor:
    """log-softmax of the model's own logits (no swapped head), for the response tokens."""
    ids, mask, pos, responses = _inputs()
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -6:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)


# ---------------------------------------------------------------------------------------------- targets, errors
def test_target_modules_follow_peft_rules():
    model = random_causal_lm("tiny", tie_word_embeddings=False)
    every = resolve_target_modules(model, "all-linear")
    assert "lm_head" not in every and len(every) == 2 * 7  # 2 layers x (q, k, v, o, gate, up, down)
    assert resolve_target_modules(model, ["q_proj", "v_proj"]) == [
        f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("q_proj", "v_proj")]
    assert resolve_target_modules(model, r".*\.1\.mlp\.down_proj") == ["model.layers.1.mlp.down_proj"]
    assert len(resolve_target_modules(model, "all-linear", ["q_proj", "k_proj"])) == 2 * 5
    assert resolve_target_modules(model, ["lm_head"]) == ["lm_head"]
    with pytest.raises(LoraConfigError, match=r"target_modules=\['qkv'\].*matches no linear layer.*q_proj"):
        resolve_target_modules(model, ["qkv"])
    with pytest.raises(LoraConfigError, match="exclude_modules"):
        resolve_target_modules(model, ["q_proj"], ["q_proj"])


def test_adapter_for_another_base_model_is_refused(tmp_path):
    source = apply_lora(random_causal_lm("tiny"), LoraSpec(rank=4))
    save_adapter(source, str(tmp_path / "adapter"), base_path="tiny-64")
    wider = random_causal_lm("tiny", hidden_size=32, num_attention_heads=2, num_key_value_heads=1)
    with pytest.raises(LoraConfigError, match="has shape .* needs .*different base model"):
        apply_lora(wider, LoraSpec(rank=4, adapter_path=str(tmp_path / "adapter")))
    shallower = random_causal_lm("tiny", num_hidden_layers=1)
    with pytest.raises(LoraConfigError, match="layers.1.*not a linear layer.*different base model"):
        apply_lora(shallower, LoraSpec(rank=4, adapter_path=str(tmp_path / "adapter")))
    with pytest.raises(LoraConfigError, match="lora_rank=8 but the adapter .* has r=4"):
        apply_lora(random_causal_lm("tiny"), LoraSpec(rank=8, adapter_path=str(tmp_path / "adapter")))
    os.remove(tmp_path / "adapter" / "adapter_model.safetensors")
    with pytest.raises(LoraConfigError, match="no adapter_model.safetensors"):
        apply_lora(random_causal_lm("tiny"), LoraSpec(rank=4, adapter_path=str(tmp_path / "adapter")))


def test_base_frozen_in_compute_dtype_adapters_fp32():
    model = apply_lora(random_causal_lm("tiny", dtype=torch.bfloat16), LoraSpec(rank=4))
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n and p.dtype == torch.float32 for n, p in trainable.items())
    assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.bfloat16}
    loss = _logprobs(model).sum()
    loss.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in trainable.values())


# ---------------------------------------------------------------------------------------------- forward paths
def test_adapter_off_is_the_base_model_and_merged_weights_are_the_adapter_model():
    base = random_causal_lm("tiny")
    expected_base = _logprobs(base).detach()
    model = apply_lora(random_causal_lm("tiny"), LoraSpec(rank=4, alpha=8))
    _randomize_b(model)
    with torch.no_grad():
        with adapter_disabled(model):
            torch.testing.assert_close(_logprobs(model), expected_base)
        adapted = _logprobs(model)
        assert (adapted - expected_base).abs().max() > 1e-2
        merged = random_causal_lm("tiny", seed=5)
        result = merged.load_state_dict(dict(merged_named_weights(model)), strict=False)
        assert result.missing_keys == ["lm_head.weight"] and not result.unexpected_keys  # tied: re-tied on load
        torch.testing.assert_close(_logprobs(merged), adapted)


def _logprobs_and_grads(model):
    model.zero_grad(set_to_none=True)
    logprobs = _logprobs(model)
    logprobs.sum().backward()
    return [logprobs.detach()] + [p.grad.float() for p in model.parameters() if p.requires_grad]


def test_addmm_forward_equals_pefts(monkeypatch):
    """The LoRA linears' one-addmm forward against PEFT's own forward (the plain reference): log-probs and every
    adapter gradient, with the adapters in the base's dtype as the compute module holds them. fp32: equal; bf16:
    no further from the fp32 result than PEFT's bf16 forward is (PEFT rounds the adapter's product, its scaling
    and the sum separately, addmm_ once)."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    peft_calls = []
    peft_forward = LoraLinear.forward
    monkeypatch.setattr(LoraLinear, "forward", lambda *a, **k: peft_calls.append(1) or peft_forward(*a, **k))
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = apply_lora(random_causal_lm("tiny"), LoraSpec(rank=4, alpha=8)).to(dtype)
        _randomize_b(model)
        layers = [module for _, module in lora_layers(model)]
        assert len(layers) == 2 * 7 and all(m.forward.__func__ is addmm_lora_forward for m in layers)
        peft_calls.clear()
        results[dtype, "addmm"] = _logprobs_and_grads(model)
        assert peft_calls == []  # the plain case never falls back
        for module in layers:
            del module.forward  # PEFT's forward again
        results[dtype, "peft"] = _logprobs_and_grads(model)
        assert len(peft_calls) == 2 * 7
    torch.testing.assert_close(results[torch.float32, "addmm"], results[torch.float32, "peft"])
    exact = results[torch.float32, "peft"]
    for i, want in enumerate(exact):  # log-probs, then each adapter gradient
        errors = {way: (results[torch.bfloat16, way][i] - want).norm() / want.norm() for way in ("addmm", "peft")}
        assert errors["addmm"] <= 1.5 * errors["peft"], (i, errors)  # both about 1-2% (bf16); measured <= 1.27x


@pytest.mark.parametrize("fused", [False, True])
def test_lora_on_lm_head_is_supported_by_both_logprob_kernels(fused):
    """The swapped lm_head uses W + scale * B @ A (the fused kernel gets the effective weight); gradients reach
    the lm_head adapter."""
    model = apply_lora(random_causal_lm("tiny", tie_word_embeddings=False), LoraSpec(rank=4, target_modules=[
        "q_proj", "lm_head"]))
    _randomize_b(model)
    lp = _logprobs(model, fused)
    torch.testing.assert_close(lp, _reference_logprobs(model), rtol=1e-5, atol=1e-5)
    lp.sum().backward()
    head = model.get_base_model().lm_head
    assert head.lora_A["default"].weight.grad.abs().sum() > 0
    with torch.no_grad(), adapter_disabled(model):
        torch.testing.assert_close(_logprobs(model, fused), _reference_logprobs(model), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------- the actor
def test_actor_update_trains_only_the_adapter_and_ref_is_the_base(tiny_model_dir, tmp_path):
    worker = actor_worker(actor_config(tiny_model_dir, str(tmp_path), *LORA))
    worker.init_model(total_training_steps=2)
    assert not worker.engine.runner.has_master_copy  # no fp32 copy of a frozen base
    batch = actor_batch()
    before = {k: v.clone() for k, v in worker.model.state_dict().items()}
    ref_before = worker.compute_ref_logprobs(batch)["ref_logprobs"]
    worker.update_policy(batch)
    changed = {k for k, v in worker.model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and all("lora_" in k for k in changed)
    assert len(changed) == 2 * 2 * 7  # A and B of every adapted layer
    torch.testing.assert_close(worker.compute_ref_logprobs(batch)["ref_logprobs"], ref_before, rtol=0, atol=0)
    assert (worker.compute_logprobs(batch)["old_logprobs"] - ref_before).abs().max() > 1e-3

    # the checkpoint holds the adapter and its optimizer state only, and reloads into a fresh worker
    worker.save_checkpoint(str(tmp_path / "ckpt"))
    import torch.distributed.checkpoint as dcp

    keys = dcp.FileSystemReader(str(tmp_path / "ckpt" / "model_optim")).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all("lora_" in k for k in model_keys), [k for k in model_keys if "lora_" not in k]
    assert any(k.startswith("optimizer.state.") and "lora_" in k for k in keys)
    fresh = actor_worker(actor_config(tiny_model_dir, str(tmp_path), *LORA))
    fresh.init_model(total_training_steps=2)
    fresh.load_checkpoint(str(tmp_path / "ckpt"))
    for (name, a), (_, b) in zip(worker.model.state_dict().items(), fresh.model.state_dict().items()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
    for state_a, state_b in zip(worker.engine.optimizer.state.values(), fresh.engine.optimizer.state.values()):
        torch.testing.assert_close(state_b["exp_avg"], state_a["exp_avg"], rtol=0, atol=0)


def test_merge_round_trip(tiny_model_dir, tmp_path):
    """npu-rl merge of a LoRA checkpoint: the merged HF model's log-probs equal the adapter model's; --adapter-only
    writes a PEFT folder that PeftModel loads to the same values."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from npu_rl.commands.merge import main as merge_main
    worker = actor_worker(actor_config(tiny_model_dir, str(tmp_path), *LORA))
    worker.init_model(total_training_steps=2)
    worker.update_policy(actor_batch())
    worker.save_checkpoint(str(tmp_path / "step" / "actor"))
    batch = actor_batch(seed=3)
    expected = worker.compute_logprobs(batch)["old_logprobs"]

    assert merge_main([str(tmp_path / "step"), "--out", str(tmp_path / "merged")]) == 0
    assert merge_main([str(tmp_path / "step"), "--out", str(tmp_path / "adapter"), "--adapter-only"]) == 0
    assert sorted(os.listdir(tmp_path / "adapter")) == ["adapter_config.json", "adapter_model.safetensors"]

    merged = actor_worker(actor_config(str(tmp_path / "merged"), str(tmp_path)))
    merged.init_model(total_training_steps=2)
    torch.testing.assert_close(merged.compute_logprobs(batch)["old_logprobs"], expected, rtol=1e-5, atol=1e-5)

    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                           str(tmp_path / "adapter"))
    with torch.no_grad():
        torch.testing.assert_close(_logprobs(peft_model), _logprobs(AutoModelForCausalLM.from_pretrained(
            str(tmp_path / "merged"))), rtol=1e-5, atol=1e-5)


def test_bf16_compute_shares_the_base_and_keeps_fp32_adapters(tiny_model_dir, tmp_path):
    """One device, bf16 compute: the base exists once (bf16, shared by the master and the compute module); the
    optimizer updates fp32 adapters, the forward runs bf16 copies of them, refreshed after every step."""
    worker = actor_worker(actor_config(tiny_model_dir, str(tmp_path), *LORA,
                                       "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16"))
    worker.init_model(total_training_steps=2)
    runner = worker.engine.runner
    master, compute = dict(runner.model.named_parameters()), dict(runner.compute_model.named_parameters())
    assert master.keys() == compute.keys()
    for name, param in master.items():
        if "lora_" in name:
            assert param.dtype == torch.float32 and compute[name].dtype == torch.bfloat16, name
        else:
            assert compute[name] is param and param.dtype == torch.bfloat16, name
    assert {id(p) for p in worker.engine.optimizer.param_groups[0]["params"]} == {
        id(p) for n, p in master.items() if "lora_" in n}
    batch = actor_batch()
    ref_before = worker.compute_ref_logprobs(batch)["ref_logprobs"]
    lora_before = {n: p.detach().clone() for n, p in master.items() if "lora_" in n}
    worker.update_policy(batch)
    for name in lora_before:
        assert master[name].dtype == torch.float32
        torch.testing.assert_close(compute[name], master[name].detach().to(torch.bfloat16), rtol=0, atol=0)
    assert any(not torch.equal(master[n], b) for n, b in lora_before.items())
    torch.testing.assert_close(worker.compute_ref_logprobs(batch)["ref_logprobs"], ref_before, rtol=0, atol=0)
