"""Qwen-VL models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) as actors: loading the model and its image side, and the model
inputs of a batch whose rows carry images.

A batch of such rows holds, besides the usual tensors:

    position_ids         [B, 3, T]  the 3-D rotary ids (temporal, height, width; npu_rl.data.images.mrope_position_ids)
                                    for the prompt, continued by +1 per response token on all three axes
    multi_modal_inputs   non-tensor, one dict per row: ``pixel_values`` [patches_i, C*t*p*p], ``image_grid_thw``
                                    [images_i, 3] (empty for a text row)

The model takes the rows' ``pixel_values`` concatenated in row order (its vision tower fills the ``<|image_pad|>``
positions in the same order) and ``position_ids`` as [3, B, T].

One vision forward per prompt (:class:`ImageFeatures`): a prompt's ``rollout.n`` rows share one ``multi_modal_inputs``
dict (``Batch.repeat`` repeats the object, and pickling keeps the sharing), so a pass over a batch encodes each
distinct dict once (:func:`encode_images`: one call of the model's ``get_image_features`` over them all) and every
micro-batch hands the model its rows' features (transformers' ``mm_encoder_outputs``, which the model scatters into
the ``<|image_pad|>`` positions as it does its own; Qwen3-VL's deepstack features too) instead of pixels. Rows are
matched by identity, so two equal dicts that are different objects are simply encoded twice. Used where no gradient
has to reach the vision tower: log-prob and reference passes, and the update when the tower is frozen
(``actor.freeze_vision_tower``, or LoRA adapters on the language model only).

Where the pixels go in instead (the update of a trained tower, every pass with transformers < 5.19), a forward's
tower call still computes each distinct dict's images once and hands their features to every row that shares them
(npu_rl.models.vision_dedup; ``NPU_RL_VISION_DEDUP=0`` turns it off).
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method

from npu_rl.data.images import QWEN_VL_TYPES, VisionInputs, VisionSpec
from npu_rl.models.kinds import is_qwen_vl_folder
from npu_rl.models.loader import load_causal_lm, resolve_model_path

MULTI_MODAL_KEY = "multi_modal_inputs"


def model_type_of(config) -> str:
    return str(getattr(config, "model_type", ""))


def is_qwen_vl(config) -> bool:
    return model_type_of(config) in QWEN_VL_TYPES


def check_qwen_vl(config, where: str = "model") -> None:
    if not is_qwen_vl(config):
        raise ValueError(f"{where}: model_type {model_type_of(config)!r} is not a Qwen-VL model "
                         f"({', '.join(QWEN_VL_TYPES)}); other vision-language families (LLaVA, Kimi-VL, InternVL "
                         "...) are not supported: their prompt layout and position ids differ")


def load_vision_inputs(path: str, mm_processor_kwargs: Optional[dict[str, Any]] = None,
                       trust_remote_code: bool = False) -> VisionInputs:
    """A Qwen-VL model folder's image side: its image processor (preprocessor_config.json; PIL backend, so no
    torchvision is needed), the resize bounds (``data.mm_processor_kwargs.{min,max}_pixels`` over the processor's
    own) and the ``<|image_pad|>`` id."""
    from transformers import AutoConfig, AutoImageProcessor

    folder = resolve_model_path(path)
    config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    check_qwen_vl(config, folder)
    try:
        processor = AutoImageProcessor.from_pretrained(folder, backend="pil", trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(f"{folder}: no image processor (preprocessor_config.json) to read the images with: "
                                f"{exc}; copy the base model's preprocessor_config.json into the folder") from exc
    kwargs = dict(mm_processor_kwargs or {})
    spec = VisionSpec.from_image_processor(processor, kwargs.get("min_pixels"), kwargs.get("max_pixels"))
    return VisionInputs(spec, processor, int(config.image_token_id))


def vision_inputs_for(model_cfg, data_cfg) -> Optional[VisionInputs]:
    """The image side the prompt data needs when ``actor_rollout_ref.model.path`` is a Qwen-VL folder, else None
    (a text model: image rows are then refused by the data set, naming the row)."""
    folder = resolve_model_path(str(model_cfg.path))
    if not is_qwen_vl_folder(folder):
        return None
    return load_vision_inputs(folder, dict(data_cfg.mm_processor_kwargs or {}), bool(model_cfg.trust_remote_code))


def load_vl_model(path: str, dtype: str | torch.dtype = "fp32", attn_implementation: str = "sdpa",
                  trust_remote_code: bool = False, gradient_checkpointing: bool = False, device=None):
    """A Qwen-VL model (``AutoModelForImageTextToText``: vision tower + language model + lm_head), refusing other
    families; ``load_causal_lm`` does the loading (the roles call it for text and Qwen-VL folders alike)."""
    from transformers import AutoConfig

    folder = resolve_model_path(path)
    check_qwen_vl(AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code), folder)
    return load_causal_lm(folder, dtype, attn_implementation=attn_implementation,
                          trust_remote_code=trust_remote_code, gradient_checkpointing=gradient_checkpointing,
                          device=device)


def multi_modal_kwargs(rows: Optional[Sequence[Any]], device, dtype: Optional[torch.dtype] = None
                       ) -> dict[str, torch.Tensor]:
    """The model's image inputs for rows' ``multi_modal_inputs`` (None or empty entries are text rows): their
    ``pixel_values`` and ``image_grid_thw`` concatenated in row order; {} when no row has an image."""
    present = [row for row in (rows if rows is not None else []) if row]
    if not present:
        return {}
    pixels = torch.cat([torch.as_tensor(row["pixel_values"]) for row in present]).to(device)
    return {"pixel_values": pixels.to(dtype) if dtype is not None else pixels,
            "image_grid_thw": torch.cat([torch.as_tensor(row["image_grid_thw"]) for row in present]).to(device)}


def placeholder_token_ids(config) -> list[int]:
    """A Qwen-VL config's vision placeholder ids (image / video pads, vision start / end): a rollout never samples
    them (one in a response would make the training forward look for an image that is not there). [] for text."""
    if getattr(config, "vision_config", None) is None:
        return []
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    return sorted({int(getattr(config, n)) for n in names if getattr(config, n, None) is not None})


def model_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] stays; [B, 3, T] (the batch layout, so rows split along dim 0) -> [3, B, T] (what the model takes)."""
    return position_ids.transpose(0, 1) if position_ids.dim() == 3 else position_ids


def vision_tower(model: torch.nn.Module) -> Optional[torch.nn.Module]:
    """The vision encoder of a Qwen-VL model (``model.model.visual``), or None for a text model."""
    inner = getattr(model, "model", None)
    return getattr(inner, "visual", None)


def vision_tower_frozen(model: torch.nn.Module) -> bool:
    """Whether no parameter of the vision tower of ``model`` (PEFT-wrapped or not) takes a gradient."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    tower = vision_tower(inner)
    return tower is not None and not any(p.requires_grad for p in tower.parameters())


def freeze_vision_tower(model: torch.nn.Module) -> int:
    """verl's ``actor.freeze_vision_tower``: the vision tower (patch embedding, blocks, merger) takes no gradient and
    the optimizer leaves it out. Returns how many parameters were frozen; raises for a model without one."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    tower = vision_tower(inner)
    if tower is None:
        raise ValueError(f"actor_rollout_ref.actor.freeze_vision_tower=True, but {type(inner).__name__} has no vision "
                         "tower (model.visual): set it to False")
    params = list(tower.parameters())
    for param in params:
        param.requires_grad_(False)
    return len(params)


def takes_encoder_outputs(model: torch.nn.Module) -> bool:
    """Whether the model's forward takes precomputed vision features (``mm_encoder_outputs``, transformers >= 5.19's
    Qwen-VL classes); with an older transformers the features cannot be handed in and every row encodes its own."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    base = getattr(inner, "model", None)
    return base is not None and "mm_encoder_outputs" in inspect.signature(base.forward).parameters


@dataclass
class ImageFeatures:
    """The vision tower's outputs for a batch's distinct image dicts (module docstring), by the dict's identity:
    per dict, its images' merged features (``pooler_output``, one [tokens_i, H] each) and, for Qwen3-VL, the
    deepstack features (per deepstack layer, one [tokens_i, H] per image)."""

    output_type: type
    pooled: dict[int, list[torch.Tensor]]
    deepstack: Optional[dict[int, list[list[torch.Tensor]]]]
    keep: list  # the dicts themselves: their ids stay theirs while the features are held
    encodes: int = 1  # vision forwards this took

    def model_inputs(self, rows: Optional[Sequence[Any]]) -> dict[str, Any]:
        """The model's keyword arguments for ``rows`` (a micro-batch's ``multi_modal_inputs``, in row order):
        ``mm_encoder_outputs`` holding their images' features; {} when no row has an image."""
        present = [row for row in (rows if rows is not None else []) if row]
        if not present:
            return {}
        missing = [i for i, row in enumerate(present) if id(row) not in self.pooled]
        if missing:
            raise KeyError(f"ImageFeatures: {len(missing)} image row(s) of this micro-batch were not encoded with the "
                           "batch (encode_images over the whole batch first)")
        pooled = tuple(t for row in present for t in self.pooled[id(row)])
        fields: dict[str, Any] = {"pooler_output": pooled}
        if self.deepstack is not None:
            layers = len(self.deepstack[id(present[0])])
            fields["deepstack_features"] = [tuple(t for row in present for t in self.deepstack[id(row)][layer])
                                            for layer in range(layers)]
        return {"mm_encoder_outputs": {"image": self.output_type(**fields)}}


def distinct_image_rows(rows: Optional[Sequence[Any]]) -> list[dict]:
    """The rows' image dicts (text rows left out), each object once, in first-seen order."""
    seen: dict[int, dict] = {}
    for row in rows if rows is not None else []:
        if row and id(row) not in seen:
            seen[id(row)] = row
    return list(seen.values())


@torch.no_grad()
def encode_images(model: torch.nn.Module, rows: Optional[Sequence[Any]], device,
                  dtype: Optional[torch.dtype] = None) -> Optional[ImageFeatures]:
    """One vision forward over the distinct image dicts of ``rows`` (a whole batch's ``multi_modal_inputs``), without
    gradient; None when no row has an image or the model cannot take precomputed features
    (:func:`takes_encoder_outputs`). Under FSDP2 the call runs as a forward of the root (its pre/post-forward hooks
    gather the root's patch embedding and merger), so every rank must call it the same number of times: once per
    pass, as each did per micro-batch before."""
    distinct = distinct_image_rows(rows)
    if not distinct or not takes_encoder_outputs(model):
        return None
    if isinstance(model, FSDPModule) and not getattr(model, "_npu_rl_image_features_registered", False):
        register_fsdp_forward_method(model, "get_image_features")
        model._npu_rl_image_features_registered = True
    inputs = multi_modal_kwargs(distinct, device, dtype)
    with warnings.catch_warnings():  # FSDP2 warns of the per-image views it returns; no backward runs through them
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
        out = model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"], return_dict=True)
    counts = [len(torch.as_tensor(row["image_grid_thw"])) for row in distinct]
    per_image = list(out.pooler_output)
    layers = getattr(out, "deepstack_features", None)
    pooled, deepstack, start = {}, ({} if layers is not None else None), 0
    for row, count in zip(distinct, counts):
        pooled[id(row)] = per_image[start:start + count]
        if deepstack is not None:
            deepstack[id(row)] = [list(layer[start:start + count]) for layer in layers]
        start += count
    return ImageFeatures(type(out), pooled, deepstack, distinct)
