"""An MoE checkpoint missing an expert's tensor is refused at validation, naming the tensor and the file."""

from __future__ import annotations

import json
import os

from safetensors.torch import load_file, save_file

from npu_rl.models.check import expert_tensor_problems, model_path_problems, moe_layer_indices
from tests.models.moe_models import save_tiny_moe


def _split_into_shards(folder: str) -> dict[str, str]:
    """Re-save model.safetensors as two shards with an index (layer 1 in the second); the weight map."""
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    os.remove(os.path.join(folder, "model.safetensors"))
    shards = {"model-00001-of-00002.safetensors": {}, "model-00002-of-00002.safetensors": {}}
    for name, tensor in tensors.items():
        shard = "model-00002-of-00002.safetensors" if ".layers.1." in name else "model-00001-of-00002.safetensors"
        shards[shard][name] = tensor.contiguous()
    weight_map = {}
    for shard, content in shards.items():
        save_file(content, os.path.join(folder, shard), metadata={"format": "pt"})
        weight_map.update({name: shard for name in content})
    return weight_map


def test_complete_moe_checkpoints_pass(tmp_path):
    for kind in ("qwen3_moe", "deepseek_v3"):
        assert model_path_problems(save_tiny_moe(str(tmp_path / kind), kind)) == []


def test_missing_expert_tensor_in_a_sharded_checkpoint_is_named_with_its_file(tmp_path):
    folder = save_tiny_moe(str(tmp_path / "m"))
    weight_map = _split_into_shards(folder)
    del weight_map["model.layers.1.mlp.experts.5.up_proj.weight"]
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    problems = model_path_problems(folder)
    assert len(problems) == 1
    assert "model.layers.1.mlp.experts.5.up_proj.weight missing" in problems[0]
    assert "model-00002-of-00002.safetensors" in problems[0] and "8 routed experts" in problems[0]


def test_missing_expert_tensor_in_a_single_file_and_a_missing_moe_layer(tmp_path):
    folder = save_tiny_moe(str(tmp_path / "d"), "deepseek_v3")  # layers 1 and 2 are MoE
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    for e in range(8):  # layer 2 loses every expert; layer 1 loses one projection of expert 0
        for proj in ("gate_proj", "up_proj", "down_proj"):
            tensors.pop(f"model.layers.2.mlp.experts.{e}.{proj}.weight")
    tensors.pop("model.layers.1.mlp.experts.0.down_proj.weight")
    save_file(tensors, path, metadata={"format": "pt"})
    problems = expert_tensor_problems(folder)
    assert any("layer 2 has no expert tensors (expected model.layers.2.mlp.experts.<0..7>.*)" in p for p in problems)
    assert any("model.layers.1.mlp.experts.0.down_proj.weight missing" in p and "model.safetensors" in p
               for p in problems)


def test_moe_layers_from_config():
    assert moe_layer_indices({"model_type": "deepseek_v3", "num_hidden_layers": 61, "first_k_dense_replace": 3,
                              "moe_layer_freq": 1}) == list(range(3, 61))
    assert moe_layer_indices({"model_type": "qwen3_moe", "num_hidden_layers": 4, "decoder_sparse_step": 2,
                              "mlp_only_layers": [3]}) == [1]
    assert moe_layer_indices({"model_type": "llama", "num_hidden_layers": 4}) is None
