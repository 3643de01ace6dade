"""Per-expert checkpoint tensors read as blocks of transformers' stacked experts (npu_rl/parallel/expert_layout.py),
against the stacked tensors transformers itself builds when it loads the same folder. One process; exact."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from npu_rl.parallel.expert_layout import per_expert_tensors, read_stacked_slice, stacked_source
from npu_rl.parallel.sharded_load import CheckpointFiles


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Qwen3-MoE (8 experts, I = 6, H = 16) saved by transformers (one tensor per expert on disk)."""
    config = Qwen3MoeConfig(vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=6,
                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                            num_experts=8, num_experts_per_tok=2)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config)
    folder = str(tmp_path_factory.mktemp("moe"))
    model.save_pretrained(folder)
    return folder, {name: t.detach().clone() for name, t in model.state_dict().items()}


def _read(folder: str, name: str, index: tuple[slice, ...], shape: tuple[int, ...]) -> torch.Tensor:
    files = CheckpointFiles.of(folder)
    source = stacked_source(name, shape[0], "qwen3_moe", lambda n: files.name_for([n], "model"))
    assert source is not None
    with safe_open(f"{folder}/{files.file_of[source.parts[0][0]]}", framework="pt") as handle:
        return read_stacked_slice(source, index, shape, handle.get_slice, torch.float32)


@pytest.mark.parametrize("experts, rows", [
    (slice(0, 8), slice(0, 12)),   # everything
    (slice(4, 8), slice(0, 12)),   # EP rank 1 of 2
    (slice(2, 4), slice(0, 6)),    # EP 4 x efsdp 2, first half of dim 1: the gate rows only
    (slice(2, 4), slice(6, 12)),   # ... second half: the up rows only
    (slice(0, 3), slice(4, 9)),    # an uneven FSDP block straddling gate and up
    (slice(5, 5), slice(0, 12)),   # no expert (an empty shard)
])
def test_blocks_of_gate_up_equal_the_stacked_tensor(saved, experts, rows):
    folder, state = saved
    stacked = state["model.layers.0.mlp.experts.gate_up_proj"]  # [8, 12, 16]: gate rows 0-5, up rows 6-11
    index = (experts, rows, slice(0, 16))
    got = _read(folder, "model.layers.0.mlp.experts.gate_up_proj", index, tuple(stacked.shape))
    assert torch.equal(got, stacked[index])


def test_down_proj_and_names(saved):
    folder, state = saved
    stacked = state["model.layers.0.mlp.experts.down_proj"]  # [8, 16, 6]
    index = (slice(1, 7), slice(3, 11), slice(0, 6))
    assert torch.equal(_read(folder, "model.layers.0.mlp.experts.down_proj", index, tuple(stacked.shape)),
                       stacked[index])
    files = CheckpointFiles.of(folder)
    source = stacked_source("model.layers.0.mlp.experts.gate_up_proj", 8, "qwen3_moe",
                            lambda n: files.name_for([n], "model"))
    assert source.parts[0][3] == "model.layers.0.mlp.experts.3.gate_proj.weight"
    assert source.parts[1][3] == "model.layers.0.mlp.experts.3.up_proj.weight"
    # a dense model type stacks nothing; a missing expert tensor is named
    assert stacked_source("model.layers.0.mlp.experts.gate_up_proj", 8, "qwen2", files.name_for) is None
    with pytest.raises(ValueError, match=r"experts\.7\.gate_proj\.weight"):
        stacked_source("model.layers.0.mlp.experts.gate_up_proj", 8, "qwen3_moe",
                       lambda n: None if ".7." in n else files.name_for([n], "model"))
    with safe_open(f"{folder}/{files.file_of[source.parts[0][0]]}", framework="pt") as handle, \
            pytest.raises(ValueError, match=r"do not stack into \[9, 12, 16\]: config.json and weights disagree"):
        read_stacked_slice(source, (slice(0, 9), slice(0, 12), slice(0, 16)), (9, 12, 16), handle.get_slice,
                           torch.float32)


def test_per_expert_tensors_give_back_the_saved_checkpoint(saved):
    """Weight sync's direction: the stacked parameters split back into exactly the tensors save_pretrained wrote,
    under their stored names, as views; a dense tensor passes as is."""
    folder, state = saved
    files = CheckpointFiles.of(folder)
    stream = [(name, state[name]) for name in ("model.layers.0.mlp.experts.gate_up_proj",
                                               "model.layers.0.mlp.experts.down_proj", "model.embed_tokens.weight")]
    out = list(per_expert_tensors(stream, "qwen3_moe", lambda n: files.name_for([n], "model")))
    names = [name for name, _ in out]
    assert len(names) == 8 * 3 + 1 and len(set(names)) == len(names)
    assert names[:2] == ["model.layers.0.mlp.experts.0.gate_proj.weight", "model.layers.0.mlp.experts.1.gate_proj.weight"]
    assert names[8] == "model.layers.0.mlp.experts.0.up_proj.weight" and names[-1] == "model.embed_tokens.weight"
    with safe_open(f"{folder}/model.safetensors", framework="pt") as handle:
        for name, tensor in out:
            assert torch.equal(tensor, handle.get_tensor(name)), name
    gate = out[0][1]
    assert gate.data_ptr() == state["model.layers.0.mlp.experts.gate_up_proj"].data_ptr()  # a view, not a copy


def test_per_expert_tensors_default_names_and_stacked_checkpoints(saved):
    _, state = saved
    tensor = state["model.layers.0.mlp.experts.down_proj"]
    names = [n for n, _ in per_expert_tensors([("model.layers.0.mlp.experts.down_proj", tensor)], "qwen3_moe")]
    assert names == [f"model.layers.0.mlp.experts.{e}.down_proj.weight" for e in range(8)]
    # a checkpoint that stores the experts stacked: nothing per-expert to resolve, the tensor passes as is
    kept = list(per_expert_tensors([("model.layers.0.mlp.experts.down_proj", tensor)], "qwen3_moe", lambda n: None))
    assert len(kept) == 1 and kept[0][1] is tensor
