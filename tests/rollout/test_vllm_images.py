"""Prompts with images for the vllm engine, without the engine: the images rebuilt from the processor's pixel values
(exactly the resized pictures), image pads collapsed, one request per prompt (a prompt's samples share its images),
the length check, the vision-token ban in a worker, and the torchvision check."""

from __future__ import annotations

import builtins
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from npu_rl.data.images import VisionInputs, VisionSpec
from npu_rl.models.synthetic import tiny_image_processor
from npu_rl.rollout.vllm_images import (ImageRequests, ban_tokens, check_prompt_lengths, check_torchvision,
                                        collapse_image_pads, images_from_pixel_values)

PAD = 9


def _vision(patch: int, max_pixels: int = 96 * 96) -> VisionInputs:
    processor = tiny_image_processor(min_pixels=28 * 28, max_pixels=max_pixels, patch_size=patch)
    return VisionInputs(VisionSpec.from_image_processor(processor), processor, PAD)


def _pictures(spec: VisionSpec, seed: int) -> list[Image.Image]:
    """Random pictures at sizes smart_resize keeps (as VisionSpec.load leaves them)."""
    rng = np.random.default_rng(seed)
    factor = spec.factor
    sizes = [(factor, factor), (2 * factor, factor), (factor, 3 * factor)]
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB") for w, h in sizes]


@pytest.mark.parametrize("patch", [14, 16], ids=["qwen2_5_vl", "qwen3_vl"])
def test_images_rebuilt_from_pixel_values_are_the_pictures(patch):
    vision = _vision(patch)
    pictures = _pictures(vision.spec, seed=patch)
    encoded = vision.spec.encode(pictures, vision.image_processor)
    rebuilt = images_from_pixel_values(encoded["pixel_values"], encoded["image_grid_thw"], vision)
    assert [image.size for image in rebuilt] == [picture.size for picture in pictures]
    for image, picture in zip(rebuilt, pictures):
        assert np.array_equal(np.asarray(image), np.asarray(picture))  # every 8-bit value back, exactly
    with pytest.raises(ValueError, match="fewer than the grids ask for"):
        images_from_pixel_values(encoded["pixel_values"][:-4], encoded["image_grid_thw"], vision)
    with pytest.raises(ValueError, match=r"expected \[patches, "):
        images_from_pixel_values(encoded["pixel_values"][:, :-1], encoded["image_grid_thw"], vision)


def test_image_pads_collapse_to_one_per_image():
    assert collapse_image_pads([1, 7, PAD, PAD, PAD, 8, 2, 7, PAD, 8], PAD) == [1, 7, PAD, 8, 2, 7, PAD, 8]
    assert collapse_image_pads([1, 2, 3], PAD) == [1, 2, 3]


def test_one_request_per_prompt_with_its_images_kept_at_their_size():
    vision = _vision(14)
    pictures = _pictures(vision.spec, seed=1)
    first = vision.spec.encode(pictures[:1], vision.image_processor)
    second = vision.spec.encode(pictures[1:], vision.image_processor)
    rows = [first, {}, second, first]  # the last prompt shares the first one's dict (as a prompt's samples do)
    token_lists = [[1, 7] + [PAD] * 4 + [8, 3], [1, 3], [7, PAD, PAD, 8, 7, PAD, PAD, 8], [7, PAD, 8]]
    requests = ImageRequests(vision)
    built = requests.prompts(token_lists, rows)
    assert built[1] == {"prompt_token_ids": [1, 3]}
    assert built[0]["prompt_token_ids"] == [1, 7, PAD, 8, 3] and built[2]["prompt_token_ids"] == [7, PAD, 8, 7, PAD, 8]
    assert built[0]["multi_modal_data"]["image"] is built[3]["multi_modal_data"]["image"]  # rebuilt once
    assert [image.size for image in built[2]["multi_modal_data"]["image"]] == [(56, 28), (28, 84)]
    # vLLM's processor keeps every image of a request at its size (smart_resize within its own bounds)
    assert built[2]["mm_processor_kwargs"] == {"size": {"shortest_edge": 56 * 28, "longest_edge": 28 * 84}}
    with pytest.raises(ValueError, match="4 prompts but 3 multi_modal_inputs rows"):
        requests.prompts(token_lists, rows[:3])


def test_prompt_length_mismatch_names_the_prompt():
    check_prompt_lengths([5, 7], [5, 7])
    with pytest.raises(RuntimeError, match="vLLM expanded prompt 1 to 9 tokens, the data set's prompt has 7"):
        check_prompt_lengths([5, 9], [5, 7])


def test_banned_tokens_get_minus_infinity_in_the_worker():
    class Model:
        def compute_logits(self, hidden):
            return hidden.clone()

    model = Model()
    worker = SimpleNamespace(model_runner=SimpleNamespace(get_model=lambda: model))
    assert ban_tokens(worker, [1, 3]) == 2
    assert ban_tokens(worker, [1, 3]) == 2  # idempotent: one patch, not two stacked
    logits = model.compute_logits(torch.zeros(2, 5))
    assert torch.isinf(logits[:, [1, 3]]).all() and (logits[:, [0, 2, 4]] == 0).all()
    ban_tokens(worker, [4])  # a new list replaces the old one
    logits = model.compute_logits(torch.zeros(1, 5))
    assert torch.isinf(logits[0, 4]) and not torch.isinf(logits[0, [1, 3]]).any()


def test_a_torchvision_that_does_not_import_is_named(monkeypatch):
    real_import = builtins.__import__

    def failing(name, *args, **kwargs):
        if name == "torchvision":
            raise RuntimeError("operator torchvision::nms does not exist")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", failing)
    with pytest.raises(RuntimeError, match=r"needs torchvision .* operator torchvision::nms does not exist.*"
                                           r"rollout.name=hf"):
        check_torchvision()
