"""A model shard holding NaN is named by the sharded load (file and tensor), before any step; before (issue 39) the
load took it and the run crashed later without naming the file. One process: the meta model is filled as is,
without FSDP (``load_sharded_weights`` reads whole tensors then)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from npu_rl.models.loader import load_causal_lm
from npu_rl.parallel.sharded_load import load_sharded_weights
from tests.parallel.test_sharded_load import save_sharded, tiny_config


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_shard_holding_nan_or_inf_is_named(tmp_path, bad):
    folder = save_sharded(str(tmp_path / "model"), tiny_config())
    name = "model.layers.1.mlp.down_proj.weight"
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        shard = os.path.join(folder, json.load(f)["weight_map"][name])
    tensors = load_file(shard)
    tensors[name][3, 5] = bad
    save_file(tensors, shard, metadata={"format": "pt"})
    model = load_causal_lm(folder, dtype="fp32", device="meta")
    with pytest.raises(ValueError, match=f"{shard}: '{name}' holds NaN or infinite values"):
        load_sharded_weights(model, folder, torch.device("cpu"))


def test_a_sound_folder_loads_as_saved(tmp_path):
    folder = save_sharded(str(tmp_path / "model"), tiny_config())
    model = load_causal_lm(folder, dtype="fp32", device="meta")
    load_sharded_weights(model, folder, torch.device("cpu"))
    saved = {}
    for name in os.listdir(folder):
        if name.endswith(".safetensors"):
            saved |= load_file(os.path.join(folder, name))
    state = model.state_dict()
    assert all(torch.equal(state[k], v.float()) for k, v in saved.items())
