"""LoRA on a Qwen-VL actor: ``all-linear`` adapts the language model only (the vision tower stays frozen, so each
prompt's images are encoded once per update too), a list naming a vision module adapts it; one update moves the
adapters only; the saved adapter merged (``npu-rl merge``) is base + scale * B @ A, a folder with its image
processor that loads as a Qwen-VL model."""

from __future__ import annotations

import os

import pytest
import torch

from npu_rl.commands.merge import merge_lora
from npu_rl.models.lora import LoraConfigError, lora_layers, resolve_target_modules, save_adapter
from npu_rl.models.synthetic import random_vl_model, save_random_vl_model
from npu_rl.models.vision import load_vision_inputs, load_vl_model, vision_tower, vision_tower_frozen
from npu_rl.protocol import Batch
from tests.models.lora.common import LORA, actor_config, actor_worker
from tests.workers.test_vl_actor import _CountCalls, _rollout_batch


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_all_linear_is_the_language_model(kind):
    model = random_vl_model(kind)
    chosen = resolve_target_modules(model, "all-linear")
    assert chosen and all(name.startswith("model.language_model.") for name in chosen)
    assert "lm_head" not in chosen
    # verl's VL LoRA example (examples/tuning/lora/run_qwen2_5_vl_7b_fsdp.sh) excludes the tower itself
    assert resolve_target_modules(model, "all-linear", ".*visual.*") == chosen
    vision = resolve_target_modules(model, ["qkv"])  # only the vision blocks have a fused qkv
    assert vision and all(name.startswith("model.visual.blocks.") for name in vision)
    with pytest.raises(LoraConfigError, match="matches no linear layer"):
        resolve_target_modules(model, ["no_such_layer"])


def test_vl_lora_update_and_merge(tmp_path):
    folder = save_random_vl_model(str(tmp_path / "vl"))
    config = actor_config(folder, str(tmp_path / "run"), *LORA, "data.max_prompt_length=128",
                          "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                          "actor_rollout_ref.actor.use_kl_loss=False")
    worker = actor_worker(config)
    worker.init_model(total_training_steps=1)
    model = worker.model
    adapted = [name for name, _ in lora_layers(model)]
    assert adapted and not any(".visual." in name for name in adapted)
    assert vision_tower_frozen(model)
    batch = _rollout_batch(folder, num_prompts=2, n=4)
    counter = _CountCalls(vision_tower(worker.engine.compute_model.get_base_model()))
    old = worker.compute_logprobs(batch)["old_logprobs"]
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    metrics = worker.update_policy(batch.union(Batch({"old_logprobs": old}))).metrics
    assert torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))
    assert counter.calls == 2  # once in the log-prob pass, once in the update (the frozen tower)
    after = model.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all("lora_" in k for k in moved), sorted(moved)[:5]
    assert any("lora_B" in k for k in moved)  # B starts at zero: the adapter now changes the weights

    adapter = save_adapter(model, str(tmp_path / "adapter"), base_path=folder)
    merged_dir = merge_lora(folder, adapter, str(tmp_path / "merged"))
    assert os.path.isfile(os.path.join(merged_dir, "preprocessor_config.json"))
    reloaded = load_vl_model(merged_dir)  # a complete Qwen-VL folder: model and image side
    assert vision_tower(reloaded) is not None and load_vision_inputs(merged_dir).image_token_id > 0
    merged = reloaded.state_dict()
    base = load_vl_model(folder).state_dict()
    scale = 8 / 4  # lora_alpha / lora_rank
    checked = 0
    for name, layer in lora_layers(model):
        hf_name = name.removeprefix("base_model.model.") + ".weight"
        a, b = layer.lora_A["default"].weight.detach(), layer.lora_B["default"].weight.detach()
        expected = base[hf_name] + scale * b.float() @ a.float()
        torch.testing.assert_close(merged[hf_name], expected, rtol=1e-6, atol=1e-6)
        checked += 1
    assert checked == len(adapted)
    untouched = [k for k in base if k.startswith("model.visual.")]
    assert untouched and all(torch.equal(merged[k], base[k]) for k in untouched)
