"""Images in prompt rows (verl's multi-modal schema, as its geo3k preprocessing writes it), read lazily and bounded.

A row carries its images in ``data.image_key`` (default ``images``): a list whose entries are ``{"bytes": b"..."}``
(what ``datasets`` writes for an ``Image`` feature; a ``path`` beside the bytes is ignored), ``{"path": "..."}``, or
a plain path string. Relative paths are tried as given, then beside the data file. Each ``<image>`` in the prompt
messages' text stands for the next image of the list, in order; the counts must match (verl asserts the same).

Only the Qwen-VL family's prompt layout is produced (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): each ``<image>`` becomes
``<|vision_start|>`` + N x ``<|image_pad|>`` + ``<|vision_end|>``, as these models' chat templates write an image
item, with N the number of merged patches of the image after resizing. The resize is qwen_vl_utils' /
transformers' ``smart_resize``: both sides multiples of ``patch_size * merge_size``, the pixel count within
``[min_pixels, max_pixels]``; so N is known from the image's header alone, and the prompt's token ids (and the
overlong-prompt filter) are settled when the data set is built, without decoding a pixel. Pixels are decoded per
batch (:meth:`VisionSpec.encode`), resized, and turned into the model's ``pixel_values`` / ``image_grid_thw`` by the
model's own image processor (resize off: the images already have the processor's grid).

Bounds, in order: a per-image ``min_pixels`` / ``max_pixels`` in the image dict (as qwen_vl_utils reads them), then
``data.mm_processor_kwargs.{min_pixels,max_pixels}``, then the image processor's own. Images whose header says more
than ``MAX_DECODE_PIXELS`` pixels are refused before decoding (a decompression bomb, or a scan no bound makes
useful).
"""

from __future__ import annotations

import io
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from PIL import Image, UnidentifiedImageError

IMAGE_TAG = "<image>"
MEDIA_TAGS = re.compile(r"<image>|<video>|<audio>")
MAX_DECODE_PIXELS = 64 * 1024 * 1024  # ~8k x 8k; larger headers are refused before decoding
VISION_START, VISION_END, IMAGE_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"
# model_type values whose prompt layout and rope index this module and npu_rl.models.vision produce
QWEN_VL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) rounded to multiples of ``factor`` with the pixel count in [min_pixels, max_pixels], aspect
    ratio kept (qwen_vl_utils.smart_resize; transformers' Qwen2-VL image processor computes the same)."""
    if max(height, width) / max(1, min(height, width)) > 200:
        raise ValueError(f"an image of {width}x{height} has an aspect ratio over 200 (the Qwen-VL limit)")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def count_image_tags(messages: Sequence[dict[str, Any]]) -> int:
    return sum(str(m.get("content", "")).count(IMAGE_TAG) for m in messages)


def images_of(row: dict[str, Any], image_key: str) -> list[Any]:
    value = row.get(image_key)
    if value is None:
        return []
    if isinstance(value, (str, bytes, dict)):
        return [value]
    return list(value)  # lists, tuples, numpy object arrays (parquet)


def _bounds(ref: Any) -> dict[str, int]:
    if isinstance(ref, dict):
        return {k: int(ref[k]) for k in ("min_pixels", "max_pixels") if ref.get(k) is not None}
    return {}


def open_image(ref: Any, base_dir: Optional[str] = None) -> Image.Image:
    """The image a row's entry names, opened lazily (PIL reads the header; pixels on first use). Raises ValueError
    naming what is wrong (unreadable bytes, a missing file, an entry of another type)."""
    if isinstance(ref, Image.Image):
        return ref
    if isinstance(ref, dict):
        if ref.get("bytes") is not None:
            source: Any = io.BytesIO(bytes(ref["bytes"]))
            what = f"{len(ref['bytes'])} bytes"
        elif ref.get("path") or ref.get("image"):
            return open_image(str(ref.get("path") or ref.get("image")), base_dir)
        else:
            raise ValueError(f"an image dict needs 'bytes' or 'path', got keys {sorted(ref)}")
    elif isinstance(ref, (str, os.PathLike)):
        path = os.path.expanduser(os.fspath(ref))
        if path.startswith("file://"):
            path = path[len("file://"):]
        if not os.path.isabs(path) and not os.path.exists(path) and base_dir:
            path = os.path.join(base_dir, path)
        if not os.path.isfile(path):
            raise ValueError(f"image file {os.fspath(ref)!r} does not exist"
                             + (f" (also tried beside the data file: {path})" if base_dir else ""))
        source, what = path, path
    elif isinstance(ref, (bytes, bytearray)):
        source, what = io.BytesIO(bytes(ref)), f"{len(ref)} bytes"
    else:
        raise ValueError(f"an image entry must be a {{'bytes': ...}} / {{'path': ...}} dict or a path, got "
                         f"{type(ref).__name__}")
    try:
        image = Image.open(source)
    except UnidentifiedImageError as exc:
        raise ValueError(f"the image ({what}) cannot be read: not an image format PIL reads (corrupt or "
                         "truncated bytes?)") from exc
    except OSError as exc:
        raise ValueError(f"the image ({what}) cannot be read: {exc}") from exc
    width, height = image.size
    if width * height > MAX_DECODE_PIXELS:
        raise ValueError(f"the image ({what}) is {width}x{height} pixels, over the {MAX_DECODE_PIXELS} pixels "
                         "npu-rl decodes; shrink it when preprocessing")
    return image


@dataclass(frozen=True)
class VisionSpec:
    """What the prompt data needs from a Qwen-VL model's image processor."""

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_image_processor(cls, processor, min_pixels: Optional[int] = None,
                             max_pixels: Optional[int] = None) -> "VisionSpec":
        size = getattr(processor, "size", None) or {}
        get = size.get if isinstance(size, dict) else lambda k: getattr(size, k, None)
        low = min_pixels or getattr(processor, "min_pixels", None) or get("shortest_edge") or cls.min_pixels
        high = max_pixels or getattr(processor, "max_pixels", None) or get("longest_edge") or cls.max_pixels
        if low > high:
            raise ValueError(f"min_pixels={low} is above max_pixels={high}")
        return cls(patch_size=int(processor.patch_size), merge_size=int(processor.merge_size),
                   temporal_patch_size=int(processor.temporal_patch_size), min_pixels=int(low), max_pixels=int(high))

    def resized_size(self, image: Image.Image, ref: Any = None) -> tuple[int, int]:
        bounds = {"min_pixels": self.min_pixels, "max_pixels": self.max_pixels, **_bounds(ref)}
        width, height = image.size
        return smart_resize(height, width, self.factor, bounds["min_pixels"], bounds["max_pixels"])

    def num_tokens(self, image: Image.Image, ref: Any = None) -> int:
        """``<|image_pad|>`` tokens the image takes in the prompt (merged patches)."""
        height, width = self.resized_size(image, ref)
        return (height // self.patch_size) * (width // self.patch_size) // self.merge_size**2

    def load(self, ref: Any, base_dir: Optional[str] = None) -> Image.Image:
        """The decoded RGB image at its resized size (what the model and vLLM see)."""
        image = open_image(ref, base_dir)
        height, width = self.resized_size(image, ref)
        image = image.convert("RGB")
        return image if image.size == (width, height) else image.resize((width, height), Image.BICUBIC)

    def encode(self, images: Sequence[Image.Image], image_processor) -> dict[str, torch.Tensor]:
        """``pixel_values`` [num_patches, C * temporal * patch^2] and ``image_grid_thw`` [num_images, 3] of images
        already resized by :meth:`load` (the processor's own resize is switched off, so its grid is ours)."""
        out = image_processor(images=list(images), do_resize=False, return_tensors="pt")
        grid = out["image_grid_thw"]
        for image, (t, h, w) in zip(images, grid.tolist()):
            assert (h * self.patch_size, w * self.patch_size) == (image.size[1], image.size[0]), (image.size, grid)
        return {"pixel_values": out["pixel_values"], "image_grid_thw": grid}


def expand_image_tags(text: str, num_tokens: Sequence[int]) -> str:
    """A rendered prompt's ``<image>`` tags -> the Qwen-VL vision block, the i-th with ``num_tokens[i]`` pads."""
    parts = text.split(IMAGE_TAG)
    if len(parts) - 1 != len(num_tokens):
        raise ValueError(f"the rendered prompt has {len(parts) - 1} {IMAGE_TAG} tags for {len(num_tokens)} images")
    out = [parts[0]]
    for count, part in zip(num_tokens, parts[1:]):
        out += [VISION_START, IMAGE_PAD * count, VISION_END, part]
    return "".join(out)


def row_image_problem(row: dict[str, Any], messages_key: str, image_key: str, base_dir: Optional[str]) -> Optional[str]:
    """What is wrong with one row's images, or None: an entry that cannot be opened, or a number of ``<image>``
    tags in the prompt that differs from the number of images."""
    refs = images_of(row, image_key)
    prompt = row.get(messages_key)
    messages = [{"content": prompt}] if isinstance(prompt, str) else [
        m for m in (prompt if prompt is not None else []) if isinstance(m, dict)]
    tags = count_image_tags(messages)
    if tags != len(refs):
        return (f"the prompt has {tags} {IMAGE_TAG} tag(s) and {image_key!r} has {len(refs)} image(s); each image "
                f"needs one {IMAGE_TAG} where it belongs in the text (verl's schema)")
    for j, ref in enumerate(refs):
        try:
            open_image(ref, base_dir)
        except ValueError as exc:
            return f"{image_key}[{j}]: {exc}"
    return None


def image_bytes(image: Image.Image, fmt: str = "PNG") -> bytes:
    """An image as encoded bytes: what a ``{"bytes": ...}`` entry holds."""
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def mrope_position_ids(input_ids: torch.Tensor, attention_mask: torch.Tensor, image_grid_thw: Optional[torch.Tensor],
                       image_token_id: int, merge_size: int) -> torch.Tensor:
    """Qwen-VL's 3-D rotary position ids (temporal, height, width) of image + text rows -> [B, 3, T].

    Text tokens advance all three axes together by 1. An image's block of ``<|image_pad|>`` tokens (grid t, h, w
    over merged patches, row-major) gets ``start + (t, i, j)``; the text after it resumes at
    ``start + max(h, w)``. Padding (``attention_mask`` 0) gets 0. Images are taken from ``image_grid_thw``
    [num_images, 3] in row order (the first row's images first). This is transformers' ``get_rope_index`` of
    Qwen2-VL / Qwen2.5-VL / Qwen3-VL for still images (tests/data/test_images.py compares the two); here it needs no
    model, so the prompt collator computes it.
    """
    batch, width = input_ids.shape
    out = torch.zeros(batch, 3, width, dtype=torch.long)
    grids = iter(image_grid_thw.tolist() if image_grid_thw is not None else [])
    for row in range(batch):
        keep = attention_mask[row].bool()
        ids = input_ids[row][keep].tolist()
        pieces, pos, i = [], 0, 0
        while i < len(ids):
            if ids[i] != image_token_id:
                j = i
                while j < len(ids) and ids[j] != image_token_id:
                    j += 1
                pieces.append(torch.arange(pos, pos + j - i).expand(3, -1))
                pos, i = pos + j - i, j
                continue
            t, h, w = next(grids)
            h, w = h // merge_size, w // merge_size
            tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
            pieces.append(torch.stack([tt, hh, ww]).reshape(3, -1) + pos)
            if ids[i:i + t * h * w] != [image_token_id] * (t * h * w):
                raise ValueError(f"row {row}: an image block has fewer <|image_pad|> tokens than its grid "
                                 f"{t}x{h}x{w} needs (a prompt cut by truncation?)")
            pos, i = pos + max(h, w), i + t * h * w
        if pieces:
            out[row, :, keep] = torch.cat(pieces, dim=1)
    return out


@dataclass(frozen=True)
class VisionInputs:
    """A vision-language model's image side, as the prompt data uses it: the resize rule, the model's image
    processor (``pixel_values`` / ``image_grid_thw``), and the ``<|image_pad|>`` id its embedding replaces."""

    spec: VisionSpec
    image_processor: Any
    image_token_id: int
