"""Image rows (verl's multi-modal schema): the resize rule and the 3-D rope ids against transformers, the data set's
tokens and pixels, and bad rows refused naming file and row."""

import os

import pytest
import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

from npu_rl.data.dataset import PromptDataset
from npu_rl.data.images import (
    VisionInputs,
    VisionSpec,
    expand_image_tags,
    image_bytes,
    mrope_position_ids,
    smart_resize,
)
from npu_rl.data.io import write_parquet
from npu_rl.data.loader import PromptCollator
from npu_rl.models.synthetic import VL_KINDS, random_vl_model, tiny_image_processor, vl_char_tokenizer


def _vision(patch_size: int = 14) -> VisionInputs:
    tokenizer = vl_char_tokenizer()
    processor = tiny_image_processor(patch_size=patch_size)
    return VisionInputs(VisionSpec.from_image_processor(processor), processor,
                        tokenizer.convert_tokens_to_ids("<|image_pad|>"))


@pytest.mark.parametrize("height,width", [(40, 50), (3, 300), (500, 20), (28, 28), (1000, 1000), (13, 7)])
def test_smart_resize_is_transformers(height, width):
    for low, high in [(28 * 28, 56 * 56), (56 * 56, 28 * 28 * 1280)]:
        assert smart_resize(height, width, 28, low, high) == hf_smart_resize(height, width, 28, low, high)
    with pytest.raises(ValueError, match="aspect ratio over 200"):
        smart_resize(1, 300, 28, 28 * 28, 56 * 56)


def test_spec_reads_the_processor_bounds():
    spec = VisionSpec.from_image_processor(tiny_image_processor())
    assert (spec.patch_size, spec.merge_size, spec.min_pixels, spec.max_pixels) == (14, 2, 28 * 28, 56 * 56)
    assert VisionSpec.from_image_processor(tiny_image_processor(), max_pixels=28 * 28 * 4).max_pixels == 3136
    # 50 x 40 -> 56 x 28 (h 28, w 56): 2 x 4 patches of 14, merged 2 x 2 -> 2 tokens
    assert spec.num_tokens(Image.new("RGB", (50, 40))) == 2
    # a per-image bound wins (qwen_vl_utils' keys): max 28*28 -> one merged patch
    assert spec.num_tokens(Image.new("RGB", (50, 40)), {"max_pixels": 28 * 28}) == 1


@pytest.mark.parametrize("kind", VL_KINDS)
def test_mrope_ids_are_transformers_get_rope_index(kind):
    tokenizer = vl_char_tokenizer()
    model = random_vl_model(kind, tokenizer)
    patch = 14 if kind == "qwen2_5_vl" else 16
    vision = _vision(patch)
    images = [vision.spec.load(Image.new("RGB", size)) for size in [(50, 40), (30, 90), (60, 60)]]
    grid = vision.spec.encode(images, vision.image_processor)["image_grid_thw"]
    counts = [int(g.prod()) // 4 for g in grid]
    texts = [expand_image_tags("ab<image>cd<image>e", counts[:2]), "plain text row", expand_image_tags(
        "x<image>", counts[2:])]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, ids)) + 2
    input_ids = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.long)
    for row, row_ids in enumerate(ids):  # left padded
        input_ids[row, width - len(row_ids):] = torch.tensor(row_ids)
        mask[row, width - len(row_ids):] = 1
    ours = mrope_position_ids(input_ids, mask, grid, vision.image_token_id, 2)  # [B, 3, T]
    types = (input_ids == vision.image_token_id).int()
    theirs, _ = model.model.get_rope_index(input_ids, mm_token_type_ids=types, image_grid_thw=grid,
                                           attention_mask=mask)  # [3, B, T]
    torch.testing.assert_close(ours, theirs.transpose(0, 1).masked_fill(~mask.bool()[:, None], 0))
    assert ours[0, 1, -1] > 0  # the last token is text after the images


def _image_rows(tmp_path):
    png = image_bytes(Image.new("RGB", (50, 40), (200, 10, 10)))
    Image.new("RGB", (30, 90), (10, 200, 10)).save(tmp_path / "green.png")
    return [
        {"prompt": [{"role": "user", "content": "<image>How many?"}], "images": [{"bytes": png}],
         "data_source": "d", "reward_model": {"ground_truth": "1"}},
        {"prompt": [{"role": "user", "content": "<image> and <image>: same?"}],
         "images": [{"bytes": png, "path": None}, {"bytes": None, "path": "green.png"}],  # beside the data file
         "data_source": "d", "reward_model": {"ground_truth": "no"}},
        {"prompt": [{"role": "user", "content": "text only"}], "images": [], "data_source": "d",
         "reward_model": {"ground_truth": "x"}},
    ]


def test_dataset_expands_tags_and_decodes_per_item(tmp_path):
    path = str(tmp_path / "train.parquet")
    write_parquet(_image_rows(tmp_path), path)
    vision = _vision()
    tokenizer = vl_char_tokenizer()
    data = PromptDataset(path, tokenizer, vision=vision, max_prompt_length=256)
    pad = vision.image_token_id
    assert [int((ids == pad).sum()) for ids in data.token_ids] == [2, 2 + 3, 0]
    assert data.texts[0].count("<|vision_start|>") == 1 and "<image>" not in data.texts[1]
    items = [data[i] for i in range(3)]
    assert items[2]["multi_modal_inputs"] == {}
    assert items[1]["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 2, 4], [1, 6, 2]]
    expected = vision.image_processor(images=[Image.new("RGB", (56, 28), (200, 10, 10))], do_resize=False,
                                      return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(items[0]["multi_modal_inputs"]["pixel_values"], expected)
    batch = PromptCollator(0, vision)(items)
    assert batch["position_ids"].shape == (3, 3, batch["input_ids"].shape[1])
    grid = torch.cat([it["multi_modal_inputs"]["image_grid_thw"] for it in items[:2]])
    torch.testing.assert_close(batch["position_ids"], mrope_position_ids(batch["input_ids"],
                                                                         batch["attention_mask"], grid, pad, 2))


@pytest.mark.parametrize("change,message", [
    (lambda r: r[0].update(images=[{"bytes": b"not a png"}]),
     "images[0]: the image (9 bytes) cannot be read: not an image format"),
    (lambda r: r[1].update(images=[r[0]["images"][0], {"bytes": None, "path": "missing.png"}]),
     "images[1]: image file 'missing.png' does not"),
    (lambda r: r[0]["prompt"][0].update(content="<image><image>two?"), "2 <image> tag(s) and 'images' has 1 image"),
    (lambda r: r[2]["prompt"][0].update(content="<image>?"), "1 <image> tag(s) and 'images' has 0 image"),
])
def test_bad_rows_name_file_and_row(tmp_path, change, message):
    rows = _image_rows(tmp_path)
    change(rows)
    path = str(tmp_path / "bad.parquet")
    write_parquet(rows, path)
    with pytest.raises(ValueError) as err:
        PromptDataset(path, vl_char_tokenizer(), vision=_vision(), max_prompt_length=256)
    assert f"{path}: row " in str(err.value) and message in str(err.value)


def test_text_model_refuses_image_rows(tmp_path):
    path = str(tmp_path / "train.parquet")
    write_parquet(_image_rows(tmp_path), path)
    with pytest.raises(ValueError, match=r"row 0 has images \('images'\) but the model reads text only"):
        PromptDataset(path, vl_char_tokenizer(), max_prompt_length=256)


def test_prompt_with_images_is_never_truncated(tmp_path):
    path = str(tmp_path / "train.parquet")
    write_parquet(_image_rows(tmp_path), path)
    with pytest.raises(ValueError, match="row 1: the prompt with its images is .* never truncated"):
        PromptDataset(path, vl_char_tokenizer(), vision=_vision(), max_prompt_length=35, truncation="left")
    data = PromptDataset(path, vl_char_tokenizer(), vision=_vision(), max_prompt_length=35,
                         filter_overlong_prompts=True)
    assert data.num_filtered >= 1 and all(len(ids) <= 35 for ids in data.token_ids)
    assert os.path.exists(path)


def test_mm_processor_kwargs_take_pixel_bounds_only():
    from npu_rl.config.schema import DataConfig

    assert DataConfig(mm_processor_kwargs={"min_pixels": 784, "max_pixels": 3136}).check("data") == []
    assert DataConfig(mm_processor_kwargs={"fps": 2}).check("data") == [
        "data.mm_processor_kwargs: ['fps'] not read here; only min_pixels / max_pixels"]
    assert DataConfig(mm_processor_kwargs={"max_pixels": -1}).check("data") == [
        "data.mm_processor_kwargs: min_pixels / max_pixels must be positive integers"]
