"""Megatron-core checkpoints (Megatron-LM, MindSpeed) read into a Hugging Face model folder, for the families npu-rl
trains: Qwen2 / Qwen2.5, Qwen3, Llama, and the mixture-of-experts Qwen3-MoE.

The two formats users hold, both as Megatron-LM writes them (``<root>/latest_checkpointed_iteration.txt``,
``<root>/iter_0000010/``):

- ``torch_dist`` (``--ckpt-format torch_dist``, the default since Megatron-LM core 0.8): a
  torch.distributed.checkpoint folder (``.metadata``, ``__*_*.distcp``) holding each tensor whole (the tensor- and
  pipeline-parallel shards are placed in their global tensor), the decoder's layers stacked on a leading axis
  (``decoder.layers.self_attention.linear_qkv.weight [L, ...]``), the norms under Transformer Engine's names
  (``linear_qkv.layer_norm_weight``), and ``common.pt`` with Megatron-LM's ``args``.
- legacy (``--ckpt-format torch``): ``mp_rank_{tp:02d}[_{pp:03d}]/model_optim_rng.pt`` per model-parallel rank, each
  ``{"model": state_dict, "args": Namespace, ...}`` with that rank's slices and its stage's layers numbered from 0.

Both are pickles. Nothing in them runs: ``.metadata`` goes through the DCP allow-list
(``npu_rl.utils.safe_load.restricted_unpickle``), the tensor files through DCP's reader with plain values only, and
``model_optim_rng.pt`` / ``common.pt`` through :func:`npu_rl.utils.safe_load.load_foreign_torch` (tensors, plain
containers, ``argparse.Namespace``; Megatron's own classes, such as enums in ``args``, become inert stand-ins).

The architecture comes from ``args`` (Megatron-LM keeps its arguments in every checkpoint): layers, widths, heads,
query groups, ``kv_channels``, ``padded_vocab_size``, ``norm_epsilon``, ``rotary_base``, ``add_qkv_bias`` (Qwen2),
``qk_layernorm`` (Qwen3), ``untie_embeddings_and_output_weights``. The names map as Megatron-Bridge maps them:

=========================================================  =================================================
Megatron                                                   Hugging Face
=========================================================  =================================================
``embedding.word_embeddings.weight``                       ``model.embed_tokens.weight``
``decoder.layers.{i}.input_layernorm`` (or TE's            ``model.layers.{i}.input_layernorm.weight``
``self_attention.linear_qkv.layer_norm_weight``)
``decoder.layers.{i}.self_attention.linear_qkv``           ``q_proj`` / ``k_proj`` / ``v_proj`` (weight, bias):
                                                           rows per query group ``[q * heads/groups, k, v]``
``decoder.layers.{i}.self_attention.linear_proj.weight``   ``self_attn.o_proj.weight``
``decoder.layers.{i}.self_attention.{q,k}_layernorm``      ``self_attn.{q,k}_norm.weight`` (Qwen3)
``decoder.layers.{i}.pre_mlp_layernorm`` (or TE's          ``post_attention_layernorm.weight``
``mlp.linear_fc1.layer_norm_weight``)
``decoder.layers.{i}.mlp.linear_fc1.weight``               ``mlp.gate_proj`` (first half), ``mlp.up_proj``
``decoder.layers.{i}.mlp.linear_fc2.weight``               ``mlp.down_proj.weight``
``decoder.final_layernorm.weight``                         ``model.norm.weight``
``output_layer.weight``                                    ``lm_head.weight`` (absent when tied)
``decoder.layers.{i}.mlp.router.weight``                   ``mlp.gate.weight`` (Qwen3-MoE)
``decoder.layers.{i}.mlp.experts.local_experts.{e}.``      ``mlp.experts.{e}.gate_proj`` (first half),
``linear_fc1.weight`` (SequentialMLP; TEGroupedMLP:         ``mlp.experts.{e}.up_proj``
``mlp.experts.linear_fc1.weight{e}``; torch_dist:
``mlp.experts.experts.linear_fc1.weight [E, ...]``)
``...linear_fc2...`` alike                                 ``mlp.experts.{e}.down_proj.weight``
=========================================================  =================================================

Qwen3-MoE (``args.num_experts`` with ``qk_layernorm``): every layer a mixture of experts (``moe_layer_freq`` 1), no
shared expert, softmax routing; ``moe_router_pre_softmax`` False (top-k of the logits, then a softmax over them)
is Hugging Face's ``norm_topk_prob=True``, True (softmax over all experts, then the top k) is ``False``. Refused,
naming the argument: shared experts (Qwen2-MoE, DeepSeek), dense layers among MoE ones, sigmoid routing, expert
bias, group-limited routing, a top-k scaling factor, and legacy files of expert-parallel runs.

In a legacy file each tensor-parallel rank holds a slice: rows (dim 0) of the embedding, ``linear_qkv`` (whole query
groups), ``linear_fc1`` (its gate rows then its up rows) and ``output_layer``; columns (dim 1) of ``linear_proj``
and ``linear_fc2``; the norms whole. Mixture-of-experts checkpoints and other layouts (uneven pipeline stages,
virtual pipelines, rope scaling, non-SwiGLU MLPs, LayerNorm) are refused, naming the argument.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

import torch

from npu_rl.parallel.checkpoint import SafeFileSystemReader, SafeLoadPlanner
from npu_rl.parallel.weights import save_hf_state_dict
from npu_rl.utils.safe_load import load_foreign_torch, restricted_unpickle

INERT = ("megatron.", "mindspeed.", "mindspeed_llm.", "transformer_engine.", "apex.")
LEGACY_FILE = "model_optim_rng.pt"
FAMILIES = ("qwen2", "qwen3", "llama", "qwen3_moe")


class MegatronCheckpointError(ValueError):
    """The checkpoint cannot be converted; the message names the file or the argument."""


# ------------------------------------------------------------------------------------------------ finding it
def iteration_folder(path: str) -> str:
    """``path`` itself when it holds a checkpoint (an ``iter_*`` folder), else the iteration its
    ``latest_checkpointed_iteration.txt`` names (``release`` included)."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise MegatronCheckpointError(f"{path} is not a folder")
    if _format_of(path):
        return path
    tracker = os.path.join(path, "latest_checkpointed_iteration.txt")
    if not os.path.isfile(tracker):
        raise MegatronCheckpointError(f"{path} holds no Megatron checkpoint: neither .metadata (torch_dist), "
                                      f"mp_rank_*/{LEGACY_FILE} (legacy) nor latest_checkpointed_iteration.txt")
    with open(tracker) as f:
        text = f.read().strip()
    name = "release" if text == "release" else f"iter_{int(text):07d}" if text.isdigit() else None
    if name is None or not os.path.isdir(os.path.join(path, name)):
        raise MegatronCheckpointError(f"{tracker} says {text!r}, and {path} has no such iteration folder")
    return os.path.join(path, name)


def _format_of(folder: str) -> str | None:
    if os.path.isfile(os.path.join(folder, ".metadata")):
        return "torch_dist"
    if glob.glob(os.path.join(folder, "mp_rank_*", LEGACY_FILE)):
        return "legacy"
    return None


# ------------------------------------------------------------------------------------------------ reading
def read_checkpoint(path: str) -> tuple[Any, dict[str, torch.Tensor], str]:
    """(Megatron-LM ``args``, every tensor whole under per-layer Megatron names, the format) of a checkpoint."""
    folder = iteration_folder(path)
    kind = _format_of(folder)
    if kind == "torch_dist":
        args, tensors = _read_torch_dist(folder)
    else:
        args, tensors = _read_legacy(folder)
    return args, tensors, kind


def _read_torch_dist(folder: str) -> tuple[Any, dict[str, torch.Tensor]]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    common = load_foreign_torch(os.path.join(folder, "common.pt"), INERT) \
        if os.path.isfile(os.path.join(folder, "common.pt")) else {}
    args = common.get("args") if isinstance(common, dict) else None
    if args is None:
        raise MegatronCheckpointError(f"{folder}/common.pt holds no 'args' (Megatron-LM's arguments): the "
                                      "architecture cannot be read")
    metadata = restricted_unpickle(os.path.join(folder, ".metadata"))
    wanted = {key: torch.empty(meta.size, dtype=meta.properties.dtype)
              for key, meta in metadata.state_dict_metadata.items()
              if isinstance(meta, TensorStorageMetadata) and not key.endswith("_extra_state")
              and not key.startswith("optimizer.")}
    dcp.load(wanted, storage_reader=SafeFileSystemReader(folder), planner=SafeLoadPlanner(), no_dist=True)
    tensors = {}
    layers = int(args.num_layers)
    for key, tensor in wanted.items():
        if key.startswith("decoder.layers."):  # stacked: [L, ...]
            if tensor.shape[0] != layers:
                raise MegatronCheckpointError(f"{folder}: {key} stacks {tensor.shape[0]} layers, args.num_layers "
                                              f"is {layers}")
            rest = key[len("decoder.layers."):]
            for i in range(layers):
                tensors[f"decoder.layers.{i}.{rest}"] = tensor[i]
        else:
            tensors[key] = tensor
    return args, tensors


_ROWS = (r"embedding\.word_embeddings\.weight", r"output_layer\.weight", r".*linear_qkv\.(weight|bias)")
_COLUMNS = (r".*linear_proj\.weight", r".*linear_fc2\.weight\d*")
_FC1 = r".*linear_fc1\.weight\d*"


def _read_legacy(folder: str) -> tuple[Any, dict[str, torch.Tensor]]:
    ranks: dict[tuple[int, int], str] = {}
    for file in glob.glob(os.path.join(folder, "mp_rank_*", LEGACY_FILE)):
        match = re.fullmatch(r"mp_rank_(\d+)(?:_(\d+))?", os.path.basename(os.path.dirname(file)))
        if match is None:
            raise MegatronCheckpointError(f"{file}: a rank folder named neither mp_rank_TT nor mp_rank_TT_PPP")
        ranks[(int(match.group(1)), int(match.group(2) or 0))] = file
    tp = 1 + max(t for t, _ in ranks)
    pp = 1 + max(p for _, p in ranks)
    missing = [f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "") for t in range(tp) for p in range(pp)
               if (t, p) not in ranks]
    if missing:
        raise MegatronCheckpointError(f"{folder} lacks {', '.join(missing)}: an incomplete checkpoint")
    args = None
    stages: list[dict[str, torch.Tensor]] = []
    for p in range(pp):
        shards = []
        for t in range(tp):
            payload = load_foreign_torch(ranks[(t, p)], INERT)
            if not isinstance(payload, dict) or not isinstance(payload.get("model"), dict):
                raise MegatronCheckpointError(f"{ranks[(t, p)]} holds no 'model' state dict")
            if args is None:
                args = payload.get("args")
            shards.append({k: v for k, v in payload["model"].items() if isinstance(v, torch.Tensor)})
        stages.append(_merge_tensor_parallel(shards, ranks[(0, p)]))
    if args is None:
        raise MegatronCheckpointError(f"{ranks[(0, 0)]} holds no 'args' (Megatron-LM's arguments): the "
                                      "architecture cannot be read")
    if int(getattr(args, "expert_model_parallel_size", None) or 1) > 1:
        raise MegatronCheckpointError(f"{folder}: args.expert_model_parallel_size={args.expert_model_parallel_size}: "
                                      "legacy files of an expert-parallel run are not converted (a torch_dist "
                                      "checkpoint of it is)")
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
        declared = getattr(args, key, None)
        found = tp if key.startswith("tensor") else pp
        if declared is not None and int(declared) != found:
            raise MegatronCheckpointError(f"{folder}: args.{key}={declared} but the folder holds {found} ranks")
    if pp > 1:
        for key in ("num_layers_per_virtual_pipeline_stage", "decoder_first_pipeline_num_layers",
                    "decoder_last_pipeline_num_layers", "num_layers_in_first_pipeline_stage",
                    "num_layers_in_last_pipeline_stage"):
            if getattr(args, key, None):
                raise MegatronCheckpointError(f"{folder}: args.{key}={getattr(args, key)}: only even pipeline "
                                              "stages without virtual stages are converted")
    per_stage = int(args.num_layers) // pp
    tensors: dict[str, torch.Tensor] = {}
    for p, stage in enumerate(stages):
        for key, tensor in stage.items():
            match = re.match(r"decoder\.layers\.(\d+)\.(.*)", key)
            if match:
                key = f"decoder.layers.{int(match.group(1)) + p * per_stage}.{match.group(2)}"
            tensors[key] = tensor
    return args, tensors


def _merge_tensor_parallel(shards: list[dict[str, torch.Tensor]], where: str) -> dict[str, torch.Tensor]:
    if len(shards) == 1:
        return shards[0]
    merged = {}
    for key in shards[0]:
        parts = [s[key] for s in shards]
        if re.fullmatch(_FC1, key):  # each rank: [its gate rows; its up rows]
            halves = [part.chunk(2, dim=0) for part in parts]
            merged[key] = torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
        elif any(re.fullmatch(p, key) for p in _ROWS):
            merged[key] = torch.cat(parts, dim=0)
        elif any(re.fullmatch(p, key) for p in _COLUMNS):
            merged[key] = torch.cat(parts, dim=1)
        else:  # norms: the same on every rank
            if any(not torch.equal(part, parts[0]) for part in parts[1:]):
                raise MegatronCheckpointError(f"{where}: {key} differs between tensor-parallel ranks; this reader "
                                              "knows it as replicated")
            merged[key] = parts[0]
    return merged


# ------------------------------------------------------------------------------------------------ mapping
def _arg(args: Any, name: str, default: Any = None) -> Any:
    return getattr(args, name, default)


def family_of(args: Any, requested: str | None = None) -> str:
    """qwen3 (q/k norms), qwen2 (q/k/v bias) or llama, from ``args`` unless ``requested``; refuses what this
    converter does not build, naming the argument."""
    refusals = {
        "multi_latent_attention": "multi-latent attention (DeepSeek) is not converted",
        "use_rope_scaling": "rope scaling (Llama 3.1's) is not converted",
        "add_bias_linear": "biases on the linear layers other than q/k/v are not converted",
    }
    for name, why in refusals.items():
        if _arg(args, name):
            raise MegatronCheckpointError(f"args.{name}={_arg(args, name)}: {why}")
    if not _arg(args, "swiglu", False):
        raise MegatronCheckpointError("args.swiglu is not set: only SwiGLU MLPs (Qwen, Llama) are converted")
    if str(_arg(args, "normalization", "LayerNorm")) != "RMSNorm":
        raise MegatronCheckpointError(f"args.normalization={_arg(args, 'normalization')}: only RMSNorm is converted")
    if str(_arg(args, "position_embedding_type", "rope")) != "rope":
        raise MegatronCheckpointError(f"args.position_embedding_type={_arg(args, 'position_embedding_type')}: "
                                      "only rotary embeddings are converted")
    found = "qwen3" if _arg(args, "qk_layernorm") else "qwen2" if _arg(args, "add_qkv_bias") else "llama"
    if _arg(args, "num_experts"):
        _check_moe(args)
        if found != "qwen3":
            raise MegatronCheckpointError(f"args.num_experts={_arg(args, 'num_experts')} without qk_layernorm: of the "
                                          "mixture-of-experts families only Qwen3-MoE is converted")
        found = "qwen3_moe"
    if requested is None:
        return found
    if requested not in FAMILIES:
        raise MegatronCheckpointError(f"--model-type {requested!r}: expected one of {', '.join(FAMILIES)}")
    if (requested == "qwen3_moe") != (found == "qwen3_moe"):
        raise MegatronCheckpointError(f"--model-type {requested}: the checkpoint's args (num_experts="
                                      f"{_arg(args, 'num_experts')}) describe {found}")
    if found == "qwen3_moe":
        return found
    if (requested == "qwen3") != bool(_arg(args, "qk_layernorm")) or \
            (requested == "qwen2") != bool(_arg(args, "add_qkv_bias")):
        raise MegatronCheckpointError(f"--model-type {requested}: the checkpoint's args (qk_layernorm="
                                      f"{_arg(args, 'qk_layernorm')}, add_qkv_bias={_arg(args, 'add_qkv_bias')}) "
                                      f"describe {found}")
    return requested


def _check_moe(args: Any) -> None:
    """Refuses the mixture-of-experts settings Qwen3-MoE does not have, naming the argument."""
    freq = _arg(args, "moe_layer_freq", 1)
    if not (freq == 1 or (isinstance(freq, (list, tuple)) and all(f == 1 for f in freq))):
        raise MegatronCheckpointError(f"args.moe_layer_freq={freq}: dense layers among the MoE ones are not converted "
                                      "(every layer of Qwen3-MoE is a mixture of experts)")
    refusals = {
        "moe_shared_expert_intermediate_size": "shared experts (Qwen2-MoE, DeepSeek) are not converted",
        "moe_router_enable_expert_bias": "an expert bias in the router (DeepSeek-V3) is not converted",
        "moe_router_num_groups": "group-limited routing (DeepSeek-V3) is not converted",
    }
    for name, why in refusals.items():
        if _arg(args, name):
            raise MegatronCheckpointError(f"args.{name}={_arg(args, name)}: {why}")
    if str(_arg(args, "moe_router_score_function", "softmax")) != "softmax":
        raise MegatronCheckpointError(f"args.moe_router_score_function={_arg(args, 'moe_router_score_function')}: "
                                      "only softmax routing (Qwen3-MoE) is converted")
    scaling = _arg(args, "moe_router_topk_scaling_factor")
    if scaling not in (None, 1, 1.0):
        raise MegatronCheckpointError(f"args.moe_router_topk_scaling_factor={scaling}: a scaled top-k is not converted")


def hf_config(args: Any, family: str, dtype: torch.dtype):
    from transformers import AutoConfig

    heads = int(args.num_attention_heads)
    groups = int(args.num_query_groups) if _arg(args, "group_query_attention") else heads
    head_dim = int(_arg(args, "kv_channels") or int(args.hidden_size) // heads)
    common = dict(vocab_size=int(_arg(args, "padded_vocab_size") or args.vocab_size),
                  hidden_size=int(args.hidden_size), intermediate_size=int(args.ffn_hidden_size),
                  num_hidden_layers=int(args.num_layers), num_attention_heads=heads, num_key_value_heads=groups,
                  head_dim=head_dim, rms_norm_eps=float(_arg(args, "norm_epsilon", 1e-5)),
                  max_position_embeddings=int(_arg(args, "max_position_embeddings") or _arg(args, "seq_length")),
                  tie_word_embeddings=not _arg(args, "untie_embeddings_and_output_weights", False),
                  hidden_act="silu", rope_theta=float(_arg(args, "rotary_base", 10000)), dtype=dtype)
    if family == "llama":
        common.update(attention_bias=False, mlp_bias=False)
    if family == "qwen3_moe":
        common.update(num_experts=int(args.num_experts), num_experts_per_tok=int(args.moe_router_topk),
                      moe_intermediate_size=int(_arg(args, "moe_ffn_hidden_size") or args.ffn_hidden_size),
                      norm_topk_prob=not _arg(args, "moe_router_pre_softmax", False), decoder_sparse_step=1,
                      mlp_only_layers=[], attention_bias=False)
    architecture = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM",
                    "qwen3_moe": "Qwen3MoeForCausalLM"}[family]
    return AutoConfig.for_model(family, architectures=[architecture], **common)


def hf_state_dict(args: Any, tensors: dict[str, torch.Tensor], family: str) -> dict[str, torch.Tensor]:
    """The Hugging Face tensors of ``tensors`` (per-layer Megatron names, whole), by the table of the module
    docstring; refuses a missing or left-over tensor, naming it."""
    heads = int(args.num_attention_heads)
    groups = int(args.num_query_groups) if _arg(args, "group_query_attention") else heads
    head_dim = int(_arg(args, "kv_channels") or int(args.hidden_size) // heads)
    per_group = heads // groups
    used: set[str] = set()

    def take(*names: str) -> torch.Tensor:
        for name in names:
            if name in tensors:
                used.add(name)
                return tensors[name]
        raise MegatronCheckpointError(f"the checkpoint has no {names[0]}" +
                                      (f" (nor {', '.join(names[1:])})" if names[1:] else ""))

    out = {"model.embed_tokens.weight": take("embedding.word_embeddings.weight"),
           "model.norm.weight": take("decoder.final_layernorm.weight")}
    if _arg(args, "untie_embeddings_and_output_weights", False):
        out["lm_head.weight"] = take("output_layer.weight")
    for i in range(int(args.num_layers)):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        out[dst + "input_layernorm.weight"] = take(src + "input_layernorm.weight",
                                                   src + "self_attention.linear_qkv.layer_norm_weight")
        out[dst + "post_attention_layernorm.weight"] = take(src + "pre_mlp_layernorm.weight",
                                                            src + "mlp.linear_fc1.layer_norm_weight")
        names = ("weight", "bias") if _arg(args, "add_qkv_bias") else ("weight",)
        for kind in names:
            qkv = take(src + f"self_attention.linear_qkv.{kind}")
            grouped = qkv.reshape(groups, (per_group + 2) * head_dim, *qkv.shape[1:])
            q, k, v = grouped.split([per_group * head_dim, head_dim, head_dim], dim=1)
            for proj, part in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                out[dst + f"self_attn.{proj}.{kind}"] = part.reshape(-1, *qkv.shape[1:]).contiguous()
        out[dst + "self_attn.o_proj.weight"] = take(src + "self_attention.linear_proj.weight")
        if family in ("qwen3", "qwen3_moe"):
            out[dst + "self_attn.q_norm.weight"] = take(src + "self_attention.q_layernorm.weight")
            out[dst + "self_attn.k_norm.weight"] = take(src + "self_attention.k_layernorm.weight")
        if family == "qwen3_moe":
            out[dst + "mlp.gate.weight"] = take(src + "mlp.router.weight")
            experts = int(args.num_experts)
            for fc, name in (("linear_fc1", "gate_up_proj"), ("linear_fc2", "down_proj")):
                stacked = src + f"mlp.experts.experts.{fc}.weight"  # torch_dist: [E, ...]
                # transformers 5 holds the experts stacked, gate_up_proj [E, 2I, H] (gate rows, then up: linear_fc1's
                # order) and down_proj [E, H, I]; save_pretrained writes them back as the per-expert
                # mlp.experts.{e}.{gate,up,down}_proj.weight of Megatron-Bridge's table
                out[dst + f"mlp.experts.{name}"] = take(stacked).contiguous() if stacked in tensors else torch.stack([
                    take(src + f"mlp.experts.local_experts.{e}.{fc}.weight", src + f"mlp.experts.{fc}.weight{e}")
                    for e in range(experts)])
            continue
        gate, up = take(src + "mlp.linear_fc1.weight").chunk(2, dim=0)
        out[dst + "mlp.gate_proj.weight"], out[dst + "mlp.up_proj.weight"] = gate.contiguous(), up.contiguous()
        out[dst + "mlp.down_proj.weight"] = take(src + "mlp.linear_fc2.weight")
    left = sorted(set(tensors) - used - {"output_layer.weight"})
    if left:
        raise MegatronCheckpointError(f"tensors this converter does not place: {', '.join(left[:5])}"
                                      f"{' ...' if len(left) > 5 else ''}")
    return out


def convert(path: str, out_dir: str, *, family: str | None = None, dtype: torch.dtype | None = None,
            tokenizer: Any = None) -> tuple[str, str]:
    """A Megatron checkpoint -> a Hugging Face folder at ``out_dir``; returns (family, format)."""
    args, tensors, kind = read_checkpoint(path)
    if not hasattr(args, "num_layers"):
        raise MegatronCheckpointError(f"{path}: 'args' is not Megatron-LM's arguments (no num_layers)")
    family = family_of(args, family)
    state = hf_state_dict(args, tensors, family)
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    stored = next(v.dtype for v in state.values() if v.is_floating_point())
    save_hf_state_dict(hf_config(args, family, stored), state, out_dir, tokenizer=tokenizer)
    return family, kind
