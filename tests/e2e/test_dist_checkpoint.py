"""Sharded checkpoints (DCP): 2 ranks -> 1 rank and back, continuing training exactly; merge to an HF folder;
full-weight streaming and HF export from a sharded model. Float32; parameters atol=1e-6, rtol=1e-5."""

from __future__ import annotations

import os

import pytest
import torch

from tests.parallel.common import make_batch, rank_and_world, rank_loss, tiny_model

pytestmark = pytest.mark.dist
TOL = dict(atol=1e-6, rtol=1e-5)


def _sharded(seed: int):
    from npu_rl.parallel import FSDPSettings, apply_fsdp2, build_mesh

    model = apply_fsdp2(tiny_model(seed=seed), build_mesh(), FSDPSettings())
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _step(model, optimizer, data_seed: int) -> None:
    rank, world_size = rank_and_world()
    input_ids, mask = make_batch(seed=data_seed)
    rank_loss(model, input_ids, mask, rank, world_size).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _full(model) -> dict:
    from npu_rl.parallel import iter_full_parameters

    return {name: t.clone() for name, t in iter_full_parameters(model, device="cpu")}  # 1 rank: no copy made


def train_save_continue(path: str) -> dict:
    """Step, save, step again: the params at the save and after the next step."""
    from npu_rl.parallel import save_checkpoint

    rank, world_size = rank_and_world()
    model, optimizer = _sharded(seed=0)
    _step(model, optimizer, data_seed=1)
    save_checkpoint(path, model, optimizer, extra={"step": 1, "rank": rank, "world": world_size})
    saved = _full(model)
    _step(model, optimizer, data_seed=2)
    return {"saved": saved, "continued": _full(model)}


def load_continue(path: str) -> dict:
    """A differently initialised model + fresh optimizer, loaded from ``path``, then the same next step."""
    from npu_rl.parallel import load_checkpoint

    model, optimizer = _sharded(seed=123)
    extra = load_checkpoint(path, model, optimizer)
    loaded = _full(model)
    _step(model, optimizer, data_seed=2)
    return {"extra": extra, "loaded": loaded, "continued": _full(model)}


def assert_params_close(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        if name.endswith("k_proj.bias"):  # zero-gradient parameter: Adam amplifies float noise (see test_fsdp)
            continue
        torch.testing.assert_close(got[name], value, **TOL, msg=name)


def test_save_on_two_ranks_load_on_one_and_merge(dist_pool2, dist_pool1, tmp_path):
    path = str(tmp_path / "ckpt2")
    two = dist_pool2.run(train_save_continue, path)[0]
    one = dist_pool1.run(load_continue, path)[0]
    assert one["extra"] == {"step": 1, "rank": 0, "world": 2}
    assert_params_close(one["loaded"], two["saved"])
    assert_params_close(one["continued"], two["continued"])  # the optimizer state came along

    from transformers import AutoModelForCausalLM

    from npu_rl.parallel import merge_checkpoint

    out = merge_checkpoint(path, str(tmp_path / "merged"))
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert merged.lm_head.weight is merged.model.embed_tokens.weight
    state = merged.state_dict()
    for name, value in two["saved"].items():
        torch.testing.assert_close(state[name], value, atol=0, rtol=0, msg=name)
    bf16 = merge_checkpoint(path, str(tmp_path / "merged_bf16"), dtype=torch.bfloat16)
    assert AutoModelForCausalLM.from_pretrained(bf16).model.embed_tokens.weight.dtype == torch.bfloat16


def test_save_on_one_rank_load_on_two(dist_pool2, dist_pool1, tmp_path):
    path = str(tmp_path / "ckpt1")
    one = dist_pool1.run(train_save_continue, path)[0]
    results = dist_pool2.run(load_continue, path)
    assert [r["extra"]["rank"] for r in results] == [0, 0]  # rank 1 falls back to rank 0's extra
    for result in results:
        assert_params_close(result["loaded"], one["saved"])
        assert_params_close(result["continued"], one["continued"])


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    from npu_rl.parallel import load_checkpoint, merge_checkpoint

    with pytest.raises(FileNotFoundError, match="not a checkpoint folder"):
        load_checkpoint(str(tmp_path), torch.nn.Linear(1, 1))
    with pytest.raises(FileNotFoundError, match="config.json"):
        merge_checkpoint(str(tmp_path), str(tmp_path / "out"))


def stream_and_export(out_dir: str) -> dict:
    from npu_rl.parallel import export_hf_folder, iter_full_parameters

    model, _ = _sharded(seed=5)
    names, dtypes = [], set()
    for name, tensor in iter_full_parameters(model, dtype=torch.bfloat16):  # what a rollout engine would load
        names.append(name)
        dtypes.add(tensor.dtype)
    export_hf_folder(model, out_dir)
    return {"names": names, "dtypes": dtypes}


def test_stream_full_parameters_and_export(dist_pool2, tmp_path):
    from transformers import AutoModelForCausalLM

    out_dir = str(tmp_path / "export")
    result = dist_pool2.run(stream_and_export, out_dir)[1]
    reference = tiny_model(seed=5)
    assert result["names"] == [n for n in reference.state_dict() if n != "lm_head.weight"]  # tied: sent once
    assert result["dtypes"] == {torch.bfloat16}
    assert os.path.isfile(os.path.join(out_dir, "config.json"))
    exported = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(exported.state_dict()[name], value, atol=0, rtol=0, msg=name)
