"""A model's shape for the planner (npu_rl.plan.memory.ModelShape), read from its config.json, a built-in model's
GGUF header or a cached Hub snapshot, without converting or downloading anything: dense, mixture-of-experts (shared
experts, MLA) and Qwen-VL models (the language model's shape with its vision tower's)."""

from __future__ import annotations

import functools
import json
import os

from npu_rl.models.check import moe_layer_indices
from npu_rl.models.loader import cache_dir, gguf_source, is_builtin, local_model_folder
from npu_rl.plan.memory import ModelShape
from npu_rl.plan.vision import vision_shape_from_config


def shape_from_config_json(path: str) -> ModelShape:
    """The shape of a model from its ``config.json`` (a file, or a folder holding one)."""
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file}: no config.json; give a model folder or --model-config FILE")
    try:
        with open(file, encoding="utf-8") as f:
            cfg = json.load(f)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # not JSON, or nested past Python's recursion
        raise ValueError(f"{file} is not a readable config.json ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{file} holds a JSON {type(cfg).__name__}, not a model config (a JSON object)")
    return shape_from_config(cfg, file)


def _moe_fields(cfg: dict) -> dict:
    """ModelShape's mixture-of-experts and MLA fields from a config.json (empty for a dense model)."""
    experts = next((int(cfg[k]) for k in ("num_experts", "n_routed_experts", "num_local_experts")
                    if isinstance(cfg.get(k), int) and cfg[k] > 0), 0)
    fields: dict = {}
    if experts:
        moe_layers = moe_layer_indices(cfg)
        num_layers = int(cfg["num_hidden_layers"])
        moe_intermediate = int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])  # Mixtral: the same
        shared = (int(cfg.get("n_shared_experts") or 0) * moe_intermediate
                  + int(cfg.get("shared_expert_intermediate_size") or 0))
        fields = dict(num_experts=experts, experts_per_token=int(cfg["num_experts_per_tok"]),
                      moe_intermediate_size=moe_intermediate, shared_expert_intermediate_size=shared,
                      shared_expert_gate=cfg.get("model_type") == "qwen2_moe",
                      num_dense_layers=num_layers - len(moe_layers) if moe_layers is not None else 0)
    if cfg.get("kv_lora_rank"):
        fields |= dict(q_lora_rank=int(cfg.get("q_lora_rank") or 0), kv_lora_rank=int(cfg["kv_lora_rank"]),
                       qk_nope_head_dim=int(cfg["qk_nope_head_dim"]), qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
                       v_head_dim=int(cfg["v_head_dim"]))
    return fields


def _language_model_config(cfg: dict) -> dict:
    """A multimodal config's language model: its ``text_config`` over the top level's fields (transformers 5 nests
    them; Qwen2.5-VL's Hub configs are flat, and keep ``tie_word_embeddings`` at the top). The vision tower:
    npu_rl/plan/vision.py."""
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        return cfg
    return {**{k: v for k, v in cfg.items() if k not in ("text_config", "vision_config")}, **text}


def shape_from_config(cfg: dict, source: str = "config.json") -> ModelShape:
    """The shape of a model from its config.json's contents (dense, MoE with shared experts, MLA); of a Qwen-VL
    model, its language model's with its vision tower."""
    vision = vision_shape_from_config(cfg, source)
    cfg = _language_model_config(cfg)
    qwen2_bias = ("qwen2", "qwen2_vl", "qwen2_5_vl", "qwen2_vl_text", "qwen2_5_vl_text")
    try:
        shape = ModelShape(
            hidden_size=int(cfg["hidden_size"]), intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]), num_heads=int(cfg["num_attention_heads"]),
            num_kv_heads=int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
            vocab_size=int(cfg["vocab_size"]), tied=bool(cfg.get("tie_word_embeddings", False)),
            head_dim=int(cfg.get("head_dim") or 0),
            attention_bias=bool(cfg.get("attention_bias", cfg.get("model_type") in qwen2_bias)),
            qk_norm=cfg.get("model_type") in ("qwen3", "qwen3_moe", "qwen3_vl", "qwen3_vl_text"),
            name=str(cfg.get("model_type", "")), vision=vision,
            **_moe_fields(cfg))
    except KeyError as exc:
        raise ValueError(f"{source}: no {exc.args[0]!r}: not a decoder-only transformer config this planner "
                         "reads") from exc
    except (TypeError, ValueError, OverflowError) as exc:  # "hidden_size": "big", a list, a float('inf') ...
        raise ValueError(f"{source}: a size that is not a whole number ({type(exc).__name__}: {exc})") from None
    sizes = {"hidden_size": shape.hidden_size, "intermediate_size": shape.intermediate_size,
             "num_hidden_layers": shape.num_layers, "num_attention_heads": shape.num_heads,
             "num_key_value_heads": shape.num_kv_heads, "vocab_size": shape.vocab_size}
    bad = {k: v for k, v in sizes.items() if v <= 0}
    if bad:
        raise ValueError(f"{source}: {', '.join(f'{k}={v}' for k, v in bad.items())} must be > 0")
    return shape


@functools.lru_cache(maxsize=8)
def _gguf_shape(gguf_path: str, mtime_ns: int, size: int) -> ModelShape:
    """The shape in a GGUF file's header, read once per file version (``mtime_ns``, ``size``) in a process:
    transformers' GGUF reader parses every field of the file, the tokenizer's ~50k tokens and merges included, for
    ten numbers (7.5 s for the 98 MB smollm2-135m-instruct on this 2-core machine)."""
    from transformers import AutoConfig  # heavy: only for a built-in model that is not converted yet

    folder, filename = os.path.split(gguf_path)
    return shape_from_config(AutoConfig.from_pretrained(folder, gguf_file=filename).to_dict(), gguf_path)


def model_shape(path: str, model_config: str | None = None, key: str = "actor_rollout_ref.model.path") -> ModelShape:
    """``model.path`` -> its shape, without converting or downloading anything."""
    if model_config:
        return shape_from_config_json(os.path.expanduser(model_config))

    if is_builtin(path):
        folder = os.path.join(cache_dir(), "models", path.lower())
        if os.path.isfile(os.path.join(folder, "config.json")):
            return shape_from_config_json(folder)
        # not converted yet (the first `npu-rl train` does that): its config from the GGUF header, nothing written
        gguf_path = os.path.join(*gguf_source(path))
        stat = os.stat(gguf_path)
        return _gguf_shape(gguf_path, stat.st_mtime_ns, stat.st_size)
    folder = local_model_folder(path)  # a folder, or a Hub / ModelScope id's cached snapshot
    if folder is None:
        raise FileNotFoundError(f"{key}={path!r} is not a folder or a cached model on this machine; give its "
                                f"config.json with --{'critic-' if key.startswith('critic') else ''}model-config FILE")
    return shape_from_config_json(folder)
