"""The sharded load on 2 gloo ranks: a model built on the meta device, parallelised there, and filled with each
rank's slices of the safetensors files (npu_rl/parallel/sharded_load.py), against the plain load.

Exact (``torch.equal``): every shard, buffer and tied weight after the sharded load equals the plain path
(``from_pretrained`` on every rank, then FSDP2), for a model stored as bf16 in several files and loaded into fp32
master weights; LoRA adapters equal the one-process ``apply_lora``; a critic's fresh value head is the model's own
``_init_weights`` drawn from the seed (``normal_(0, initializer_range)``). Logits after the load match the plain
model's within fp32 summation-order noise (atol=1e-5).

Memory: ``test_host_memory_per_rank`` measures each rank's peak resident memory (VmHWM, reset before each load)
on a model of the Qwen2.5-0.5B width (hidden 896, vocabulary 151,936, 14 heads, 2 KV heads) with 2 decoder layers
instead of 24 (so the test takes about a minute on 2 cores; the embedding, the largest tensor, is full size). The
full 24-layer shape was measured the same way (docs/distributed.md, "Loading a large model").
"""

from __future__ import annotations

import gc
import os

import pytest
import torch

from npu_rl.parallel.sharded_load import CheckpointFiles
from tests.parallel.common import make_batch, rank_and_world

pytestmark = pytest.mark.dist


def _fsdp_config(param_dtype: str = "fp32"):
    from npu_rl.config.engine_schema import FSDPConfig, MixedPrecisionConfig

    return FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype=param_dtype, reduce_dtype="fp32"))


def save_sharded(folder: str, config, seed: int = 0, max_shard_size: str = "40KB", model_class=None) -> str:
    """A random model of ``config`` saved as bf16 safetensors split over several files (an index json)."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = (model_class or Qwen2ForCausalLM)(config).to(torch.bfloat16)
    model.save_pretrained(folder, max_shard_size=max_shard_size)
    return folder


def tiny_config(tie: bool = True):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       tie_word_embeddings=tie, eos_token_id=2, pad_token_id=0, bos_token_id=None)


def qwen05b_width_config(num_layers: int = 2):
    """Qwen2.5-0.5B's config.json with fewer layers."""
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=num_layers,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


# ---------------------------------------------------------------------------------------------- on the ranks
def _runner(model, weights_folder=None, param_dtype="fp32"):
    from npu_rl.workers.model_runner import ModelRunner

    return ModelRunner(model, _fsdp_config(param_dtype), trainable=True, weights_folder=weights_folder, init_seed=7)


def _local_state(model) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {name: (t.to_local() if isinstance(t, DTensor) else t).detach().clone()
            for name, t in [*model.named_parameters(), *model.named_buffers()]}


def compare_job(folder: str, kind: str, adapter_path: str | None = None) -> dict:
    """Sharded load vs plain load (+FSDP2) on this rank: names whose local shards differ, and the full tensors."""
    from npu_rl.models.loader import load_causal_lm, load_value_model
    from npu_rl.models.lora import LoraSpec, apply_lora, hf_model
    from npu_rl.parallel.weights import iter_full_parameters
    from npu_rl.workers.model_runner import sharded_load_folder

    weights_folder = sharded_load_folder(folder)
    assert weights_folder is not None  # 2 ranks, safetensors

    def build(device):
        if kind == "critic":
            return load_value_model(folder, dtype="fp32", device=device)
        model = load_causal_lm(folder, dtype="bf16" if kind == "lora" else "fp32", device=device)
        if kind == "lora":
            spec = LoraSpec(rank=4, alpha=8, target_modules="all-linear", adapter_path=adapter_path)
            model = apply_lora(model, spec, seed=3)
        return model

    sharded = _runner(build("meta"), weights_folder).model
    plain = _runner(build(None)).model
    mine, theirs = _local_state(sharded), _local_state(plain)
    differ = sorted(n for n in theirs if not torch.equal(mine[n], theirs[n]))
    local_bytes = sum(p.to_local().numel() * p.to_local().element_size() for p in sharded.parameters())
    out = {"keys_match": mine.keys() == theirs.keys(), "differ": differ, "local_bytes": local_bytes,
           "full": {n: t.clone() for n, t in iter_full_parameters(sharded, include_tied=True)}}
    hf = hf_model(sharded)  # the HF model under a PEFT wrapper
    if kind != "critic":
        out["tied"] = hf.lm_head.weight is hf.model.embed_tokens.weight
        input_ids, mask = make_batch()
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            out["logits"] = sharded(input_ids=input_ids, attention_mask=mask, position_ids=position_ids).logits
    return out


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _peak_rss_of(build) -> tuple[float, object]:
    """(peak resident memory above the current level in MiB, result) of ``build()``: VmHWM reset first."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    before = _status_kb("VmRSS")
    result = build()
    return (_status_kb("VmHWM") - before) / 1024, result


def memory_job(folder: str) -> dict:
    """Peak host memory of the two paths on this rank, fp32 master weights from bf16 files."""
    from npu_rl.models.loader import load_causal_lm
    from npu_rl.workers.model_runner import sharded_load_folder

    rank, _ = rank_and_world()
    weights_folder = sharded_load_folder(folder)
    load_causal_lm(folder, dtype="fp32", device="meta")  # imports and config parsing outside the measurement
    sharded_mib, model = _peak_rss_of(
        lambda: _runner(load_causal_lm(folder, dtype="fp32", device="meta"), weights_folder).model)
    local_mib = sum(p.to_local().numel() * p.to_local().element_size() for p in model.parameters()) / 2**20
    digest = {n: t for n, t in _local_state(model).items()}
    del model
    gc.collect()
    plain_mib, model = _peak_rss_of(lambda: _runner(load_causal_lm(folder, dtype="fp32")).model)
    same = all(torch.equal(t, digest[n]) for n, t in _local_state(model).items())
    del model, digest
    gc.collect()
    return {"rank": rank, "sharded_mib": sharded_mib, "plain_mib": plain_mib, "local_mib": local_mib, "same": same}


# ---------------------------------------------------------------------------------------------- the tests
@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded")
    out = {}
    for tie in (True, False):
        out[tie] = save_sharded(str(root / f"tie{int(tie)}"), tiny_config(tie))
    return out


def _plain_full(folder: str, kind: str = "causal") -> dict[str, torch.Tensor]:
    from npu_rl.models.loader import load_causal_lm, load_value_model

    model = load_value_model(folder) if kind == "critic" else load_causal_lm(folder, dtype="fp32")
    return model


@pytest.mark.parametrize("tie", [True, False])
def test_sharded_load_equals_plain_load(dist_pool2, folders, tie):
    folder = folders[tie]
    assert len([f for f in os.listdir(folder) if f.endswith(".safetensors")]) > 3  # really several files
    results = dist_pool2.run(compare_job, folder, "causal")
    plain = _plain_full(folder)
    input_ids, mask = make_batch()
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = plain(input_ids=input_ids, attention_mask=mask, position_ids=position_ids).logits
    for result in results:
        assert result["keys_match"] and result["differ"] == []
        assert result["tied"] is tie
        for name, tensor in plain.state_dict().items():
            assert torch.equal(result["full"][name], tensor), name
        torch.testing.assert_close(result["logits"], logits, atol=1e-5, rtol=1e-5)
    # the memory planner's count of this rank's fp32 shards (npu_rl/plan/memory.py): the two ranks together hold
    # exactly the model, each its half (up to one row of padding per tensor)
    from npu_rl.plan.memory import ModelShape, RoleMemory, TrainSettings

    shape = ModelShape(64, 128, 3, 4, 2, 128, tied=tie)
    planned = RoleMemory(shape, TrainSettings(shard=2), trainable=True).weights()
    assert sum(r["local_bytes"] for r in results) == 2 * planned == shape.num_params * 4
    assert all(abs(r["local_bytes"] / planned - 1) < 0.05 for r in results)


def test_critic_value_head_is_seeded_init(dist_pool2, folders):
    folder = folders[True]
    results = dist_pool2.run(compare_job, folder, "critic")
    plain = _plain_full(folder, "critic")
    std = plain.config.initializer_range
    torch.manual_seed(7)  # the runner's init_seed
    expected = torch.empty(1, 64).normal_(0.0, std)  # Linear(64 -> 1): _init_weights draws normal_(0, std)
    for result in results:
        # the plain path draws the head from the global RNG, so only the trunk is compared with it (the [1, 64]
        # head's rows all live on rank 0)
        assert set(result["differ"]) <= {"score.weight"}
        torch.testing.assert_close(result["full"]["score.weight"], expected, atol=0, rtol=0)
        for name, tensor in plain.state_dict().items():
            if not name.startswith("score."):
                assert torch.equal(result["full"][name], tensor), name


@pytest.mark.parametrize("saved", [False, True])
def test_lora_adapters_equal_one_process(dist_pool2, folders, tmp_path, saved):
    """Fresh adapters (drawn from the seed) and a saved adapter (read from its folder) on a meta base."""
    pytest.importorskip("peft")
    from npu_rl.models.loader import load_causal_lm
    from npu_rl.models.lora import LoraSpec, apply_lora, save_adapter

    folder = folders[True]
    adapter_path = None
    if saved:  # an adapter whose B is not zero, saved in PEFT format
        trained = apply_lora(load_causal_lm(folder, dtype="bf16"), LoraSpec(rank=4, alpha=8), seed=11)
        with torch.no_grad():
            for name, param in trained.named_parameters():
                if "lora_B" in name:
                    param.normal_(generator=torch.Generator().manual_seed(len(name)))
        adapter_path = save_adapter(trained, str(tmp_path / "adapter"))
    results = dist_pool2.run(compare_job, folder, "lora", adapter_path)
    one = apply_lora(load_causal_lm(folder, dtype="bf16"),
                     LoraSpec(rank=4, alpha=8, target_modules="all-linear", adapter_path=adapter_path), seed=3)
    expected = {n: p.detach() for n, p in one.named_parameters()}
    assert any("lora_A" in n for n in expected)
    if saved:
        assert any("lora_B" in n and p.abs().sum() > 0 for n, p in expected.items())
    for result in results:
        assert result["keys_match"] and result["differ"] == []
        for name, tensor in expected.items():
            assert result["full"][name].dtype == tensor.dtype, name
            assert torch.equal(result["full"][name], tensor), name


def _param_counts(folder: str) -> dict[str, int]:
    from safetensors import safe_open

    files = CheckpointFiles.of(folder)
    counts = {}
    for name in set(files.file_of.values()):
        with safe_open(os.path.join(folder, name), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118
                shape = f.get_slice(key).get_shape()
                counts[key] = int(torch.tensor(shape).prod()) if shape else 1
    return counts
