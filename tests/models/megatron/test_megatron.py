"""Megatron checkpoints -> Hugging Face folders (npu_rl/models/megatron.py, ``npu-rl convert``).

The checkpoints under fixtures/ were written by the real megatron-core 0.16.1 on CPU (make_fixtures.py beside this
file: tiny Qwen2 / Qwen3 / Llama GPT models and a Qwen3-MoE one (4 experts, top 2, its experts a SequentialMLP),
tensor parallel 2 on 2 gloo processes, saved as torch_dist and as Megatron-LM's legacy mp_rank_* files), with
megatron-core's own logits. The converted folders must give the same logits through transformers (fp32)."""

from __future__ import annotations

import argparse
import os
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from npu_rl.commands.convert import main as convert_main
from npu_rl.models.megatron import MegatronCheckpointError, convert, family_of, iteration_folder
from npu_rl.utils.safe_load import UnsafeFileError

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


@pytest.mark.parametrize("kind", ["legacy", "torch_dist"])
@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama", "qwen3_moe"])
def test_converted_logits_equal_megatron_cores(tmp_path, family, kind):
    reference = torch.load(os.path.join(FIXTURES, f"{family}_tp2", "reference.pt"), weights_only=True)
    out = str(tmp_path / "hf")
    assert convert(os.path.join(FIXTURES, f"{family}_tp2", kind), out) == (family, kind)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(model).__name__ == {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                                    "llama": "LlamaForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}[family]
    with torch.no_grad():
        logits = model(reference["ids"]).logits
    torch.testing.assert_close(logits, reference["logits"], rtol=1e-5, atol=1e-5)


def _copy(tmp_path, family="qwen2", kind="legacy") -> str:
    folder = str(tmp_path / "ckpt")
    shutil.copytree(os.path.join(FIXTURES, f"{family}_tp2", kind), folder)
    return folder


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_a_hostile_pickle_is_refused_without_running(tmp_path, monkeypatch):
    folder = _copy(tmp_path)
    shard = os.path.join(folder, "iter_0000001", "mp_rank_01", "model_optim_rng.pt")
    payload = torch.load(shard, weights_only=False)  # our own fixture
    payload["args"].hook = _RunsCode()
    torch.save(payload, shard)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsafeFileError, match=r"mp_rank_01/model_optim_rng.pt was not loaded: it asks for "
                                              r"(posix|os)\.system"):
        convert(folder, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "PWNED")
    # the same through the command: exit 2, the reason on one line, nothing written
    assert convert_main([folder, "--out", str(tmp_path / "out2")]) == 2
    assert not os.path.exists(tmp_path / "PWNED") and not os.path.exists(tmp_path / "out2")


def test_megatron_classes_in_args_load_inert(tmp_path):
    """Megatron-LM keeps enums in its arguments (AttnBackend ...): they load as stand-ins, never imported."""
    folder = _copy(tmp_path, "qwen3")
    shard = os.path.join(folder, "iter_0000001", "mp_rank_00", "model_optim_rng.pt")
    payload = torch.load(shard, weights_only=False)
    fake = type("AttnBackend", (), {"__reduce__": lambda self: (type(self), ())})
    fake.__module__, fake.__qualname__ = "megatron.core.transformer.enums", "AttnBackend"
    import sys
    import types

    module = types.ModuleType("megatron.core.transformer.enums")
    module.AttnBackend = fake
    saved = {name: sys.modules.get(name) for name in ("megatron", "megatron.core", "megatron.core.transformer",
                                                      "megatron.core.transformer.enums")}
    try:
        for name in saved:
            sys.modules[name] = module if name.endswith("enums") else types.ModuleType(name)
        payload["args"].attention_backend = fake()
        torch.save(payload, shard)
    finally:
        for name, value in saved.items():
            if value is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = value
    assert convert(folder, str(tmp_path / "out")) == ("qwen3", "legacy")
    assert "megatron.core.transformer.enums" not in sys.modules


def test_incomplete_and_unsupported_checkpoints_are_refused(tmp_path):
    folder = _copy(tmp_path)
    os.remove(os.path.join(folder, "iter_0000001", "mp_rank_01", "model_optim_rng.pt"))
    os.rmdir(os.path.join(folder, "iter_0000001", "mp_rank_01"))
    # one rank left: it reads as TP=1 and the declared size disagrees
    with pytest.raises(MegatronCheckpointError, match="args.tensor_model_parallel_size=2 but the folder holds 1"):
        convert(folder, str(tmp_path / "out"))
    with pytest.raises(MegatronCheckpointError, match="holds no Megatron checkpoint"):
        iteration_folder(str(tmp_path))
    base = dict(swiglu=True, normalization="RMSNorm", position_embedding_type="rope", qk_layernorm=False,
                add_qkv_bias=True)
    with pytest.raises(MegatronCheckpointError, match="args.num_experts=8 without qk_layernorm: of the mixture-of"):
        family_of(argparse.Namespace(**base, num_experts=8))  # Qwen2-MoE-like: not converted
    moe = {**base, "qk_layernorm": True, "add_qkv_bias": False, "num_experts": 8}
    assert family_of(argparse.Namespace(**moe)) == "qwen3_moe"
    for extra, why in [({"moe_shared_expert_intermediate_size": 64}, "shared experts"),
                       ({"moe_layer_freq": [1, 0]}, "dense layers among the MoE ones"),
                       ({"moe_router_score_function": "sigmoid"}, "only softmax routing"),
                       ({"moe_router_enable_expert_bias": True}, "expert bias"),
                       ({"moe_router_num_groups": 8}, "group-limited routing"),
                       ({"moe_router_topk_scaling_factor": 2.5}, "scaled top-k"),
                       ({"multi_latent_attention": True}, "multi-latent attention")]:
        with pytest.raises(MegatronCheckpointError, match=why):
            family_of(argparse.Namespace(**moe, **extra))
    with pytest.raises(MegatronCheckpointError, match="--model-type qwen3: the checkpoint's .* describe qwen3_moe"):
        family_of(argparse.Namespace(**moe), "qwen3")
    with pytest.raises(MegatronCheckpointError, match="args.swiglu is not set"):
        family_of(argparse.Namespace(**{**base, "swiglu": False}))
    with pytest.raises(MegatronCheckpointError, match="--model-type qwen3: the checkpoint's args .* describe qwen2"):
        family_of(argparse.Namespace(**base), "qwen3")


def test_the_command_writes_a_loadable_folder_and_keeps_the_source(tmp_path, capsys):
    folder = _copy(tmp_path, "llama", "torch_dist")
    out = str(tmp_path / "hf")
    assert convert_main([folder, "--out", out, "--dtype", "bf16"]) == 0
    assert "torch_dist, llama" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(out)
    assert next(model.parameters()).dtype == torch.bfloat16
    # --out is the checkpoint itself: refused, the checkpoint intact
    assert convert_main([folder, "--out", folder, "--force"]) == 2
    assert os.path.isfile(os.path.join(folder, "iter_0000001", ".metadata"))
    assert "will not be replaced: that would delete the input" in capsys.readouterr().err


def test_pipeline_stages_of_a_legacy_checkpoint(tmp_path):
    """PP=2 x TP=2 legacy files as Megatron-LM names them (mp_rank_TT_PPP; each stage numbers its layers from 0, the
    embedding on the first, the final norm and output layer on the last), cut here from the TP=2 fixture since a
    pipeline forward does not run on CPU: the converted logits are megatron-core's."""
    source = os.path.join(FIXTURES, "qwen3_tp2", "legacy", "iter_0000001")
    folder = tmp_path / "ckpt" / "iter_0000001"
    for t in range(2):
        payload = torch.load(os.path.join(source, f"mp_rank_{t:02d}", "model_optim_rng.pt"), weights_only=False)
        payload["args"].pipeline_model_parallel_size = 2
        for p in range(2):
            stage = {}
            for key, value in payload["model"].items():
                if key.startswith("decoder.layers."):
                    layer, rest = key[len("decoder.layers."):].split(".", 1)
                    if int(layer) == p:  # 2 layers, one per stage, renumbered from 0
                        stage[f"decoder.layers.0.{rest}"] = value
                elif key.startswith("embedding.") and p == 0 or key.startswith(("decoder.final", "output_layer")) \
                        and p == 1:
                    stage[key] = value
            os.makedirs(folder / f"mp_rank_{t:02d}_{p:03d}")
            torch.save({**payload, "model": stage}, folder / f"mp_rank_{t:02d}_{p:03d}" / "model_optim_rng.pt")
    out = str(tmp_path / "hf")
    assert convert(str(folder), out) == ("qwen3", "legacy")
    reference = torch.load(os.path.join(FIXTURES, "qwen3_tp2", "reference.pt"), weights_only=True)
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()(reference["ids"]).logits
    torch.testing.assert_close(logits, reference["logits"], rtol=1e-5, atol=1e-5)


def _rewrite_legacy(tmp_path, family: str, change) -> str:
    """The family's legacy fixture with ``change(payload)`` applied to each rank's file."""
    folder = _copy(tmp_path, family)
    for t in range(2):
        shard = os.path.join(folder, "iter_0000001", f"mp_rank_{t:02d}", "model_optim_rng.pt")
        payload = torch.load(shard, weights_only=False)  # our own fixture
        change(payload)
        torch.save(payload, shard)
    return folder


def test_moe_experts_under_transformer_engines_names_and_norm_topk_prob(tmp_path):
    """TEGroupedMLP's legacy names (mlp.experts.linear_fc1.weight<e>, as Megatron-Bridge maps them; Transformer
    Engine does not run on CPU, so they are renamed here from the SequentialMLP fixture) convert to the same model;
    moe_router_pre_softmax picks Hugging Face's norm_topk_prob; expert-parallel legacy files are refused."""
    import re

    def te_names(payload):
        sequential = r"mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.weight"
        payload["model"] = {re.sub(sequential, r"mlp.experts.\2.weight\1", k): v for k, v in payload["model"].items()}

    out = str(tmp_path / "hf")
    assert convert(_rewrite_legacy(tmp_path, "qwen3_moe", te_names), out) == ("qwen3_moe", "legacy")
    reference = torch.load(os.path.join(FIXTURES, "qwen3_moe_tp2", "reference.pt"), weights_only=True)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert model.config.norm_topk_prob is True and model.config.num_experts == 4
    with torch.no_grad():
        torch.testing.assert_close(model(reference["ids"]).logits, reference["logits"], rtol=1e-5, atol=1e-5)

    def pre_softmax(payload):
        payload["args"].moe_router_pre_softmax = True

    shutil.rmtree(tmp_path / "ckpt")
    convert(_rewrite_legacy(tmp_path, "qwen3_moe", pre_softmax), str(tmp_path / "hf2"))
    assert AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf2")).config.norm_topk_prob is False

    def expert_parallel(payload):
        payload["args"].expert_model_parallel_size = 2

    shutil.rmtree(tmp_path / "ckpt")
    with pytest.raises(MegatronCheckpointError, match="expert_model_parallel_size=2: legacy files of an expert-par"):
        convert(_rewrite_legacy(tmp_path, "qwen3_moe", expert_parallel), str(tmp_path / "hf3"))
