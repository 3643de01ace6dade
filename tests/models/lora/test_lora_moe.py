"""LoRA on mixture-of-experts models (npu_rl/models/lora.py): the routed experts stay frozen and without an adapter
(PEFT would wrap the stacked 3-D experts under transformers 5); the adapter trains, saves, reloads and merges to the
Hugging Face layout."""

from __future__ import annotations

import json
import os

import pytest
import torch

from npu_rl.models.lora import LoraSpec, apply_lora, load_adapter_model, merged_named_weights, save_adapter
from tests.models.moe_models import tiny_moe

ATTENTION = {"qwen3_moe": {"q_proj", "k_proj", "v_proj", "o_proj"},
             "deepseek_v3": {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"}}
# the linear layers of a DeepSeek-V3 MLP outside the routed experts: its dense first layer's and its shared experts'
# (tiny_moe: first_k_dense_replace=1, three layers)
DENSE_MLP = {"qwen3_moe": set(),
             "deepseek_v3": {f"model.layers.{i}.mlp{part}.{proj}" for i, part in ((0, ""), (1, ".shared_experts"),
                                                                        (2, ".shared_experts"))
                             for proj in ("gate_proj", "up_proj", "down_proj")}}


@pytest.mark.parametrize("kind", ["qwen3_moe", "deepseek_v3"])
def test_experts_stay_frozen_and_the_adapter_round_trips(tmp_path, kind):
    base = tiny_moe(kind, 0)
    base_dir = str(tmp_path / "base")
    base.save_pretrained(base_dir)
    plain = {n: t.clone() for n, t in base.state_dict().items()}
    model = apply_lora(base, LoraSpec(rank=4, alpha=8, target_modules="all-linear"), base_path=base_dir)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    layers = {n.split(".lora_")[0].removeprefix("base_model.model.") for n in trainable}
    attention = {n for n in layers if ".self_attn." in n}
    assert {n.rsplit(".", 1)[-1] for n in attention} == ATTENTION[kind], attention
    assert layers - attention == DENSE_MLP[kind], layers - attention  # no routed "experts", no router
    assert all("lora_" in n for n in trainable)
    assert not any(type(m).__name__ == "ParamWrapper" for m in model.modules())
    # train the adapter a little: the experts do not move, the merged weights do
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    ids = torch.randint(3, 60, (2, 10))
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    merged = dict(merged_named_weights(model))
    assert set(merged) == set(plain)  # the Hugging Face layout, stacked experts included
    experts = [n for n in plain if ".experts." in n]
    assert experts and all(torch.equal(merged[n], plain[n]) for n in experts)
    assert any(not torch.equal(merged[n], plain[n]) for n in plain if n.endswith("o_proj.weight"))
    assert all(not torch.equal(merged[f"{n}.weight"], plain[f"{n}.weight"]) for n in DENSE_MLP[kind])
    # save -> adapter_config.json names no expert parameter; the reload gives the same merged weights
    out = save_adapter(model, str(tmp_path / "adapter"), base_path=base_dir)
    with open(os.path.join(out, "adapter_config.json")) as f:
        saved = json.load(f)
    assert not saved.get("target_parameters")
    assert not any("gate_up_proj" in k for k in {**saved["rank_pattern"], **saved["alpha_pattern"]})
    reloaded = dict(merged_named_weights(load_adapter_model(base_dir, out)))
    for name, tensor in merged.items():
        torch.testing.assert_close(reloaded[name], tensor, msg=name)


def test_a_target_peft_left_without_an_adapter_is_an_error(tmp_path):
    """PEFT 0.21 took the shared experts' and dense layers' projections off along with the routed experts'; a run
    must not go on training fewer layers than target_modules names."""
    from npu_rl.models.lora import LoraConfigError, check_every_target_adapted, resolve_target_modules

    base = tiny_moe("deepseek_v3", 0)
    chosen = resolve_target_modules(base, "all-linear")
    model = apply_lora(base, LoraSpec(rank=4, alpha=8, target_modules="all-linear"))
    check_every_target_adapted(model, chosen, "actor_rollout_ref.model")  # all there
    shared = "model.layers.1.mlp.shared_experts.gate_proj"
    peft_layer = model.get_submodule(f"base_model.model.{shared}")
    parent, _, child = f"base_model.model.{shared}".rpartition(".")
    setattr(model.get_submodule(parent), child, peft_layer.get_base_layer())  # as PEFT 0.21 left it
    with pytest.raises(LoraConfigError, match=r"target_modules: PEFT .* no adapter on 1 of the .*shared_experts"
                                              r"\.gate_proj.*peft>=0\.22"):
        check_every_target_adapted(model, chosen, "actor_rollout_ref.model")
