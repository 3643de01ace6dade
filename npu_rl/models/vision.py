"""Qwen-VL models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) as actors: loading the model and its image side, and the model
inputs of a batch whose rows carry images.

A batch of such rows holds, besides the usual tensors:

    position_ids         [B, 3, T]  the 3-D rotary ids (temporal, height, width; npu_rl.data.images.mrope_position_ids)
                                    for the prompt, continued by +1 per response token on all three axes
    multi_modal_inputs   non-tensor, one dict per row: ``pixel_values`` [patches_i, C*t*p*p], ``image_grid_thw``
                                    [images_i, 3] (empty for a text row)

The model takes the rows' ``pixel_values`` concatenated in row order (its vision tower fills the ``<|image_pad|>``
positions in the same order) and ``position_ids`` as [3, B, T]. The vision tower runs once per row and forward
(a prompt's ``rollout.n`` samples each run it): caching it per prompt is not built.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

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


def model_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] stays; [B, 3, T] (the batch layout, so rows split along dim 0) -> [3, B, T] (what the model takes)."""
    return position_ids.transpose(0, 1) if position_ids.dim() == 3 else position_ids


def vision_tower(model: torch.nn.Module) -> Optional[torch.nn.Module]:
    """The vision encoder of a Qwen-VL model (``model.model.visual``), or None for a text model."""
    inner = getattr(model, "model", None)
    return getattr(inner, "visual", None)
