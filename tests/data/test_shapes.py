"""The generated visual task (builtin://shapes): each picture holds as many shapes as its ground truth says (counted
here from the pixels), rows are verl's multi-modal schema, and the data set reads them for a Qwen-VL model."""

import io

import numpy as np
import pytest
from PIL import Image

from npu_rl.data.builtin import check_builtin, resolve_builtin
from npu_rl.data.dataset import PromptDataset
from npu_rl.data.images import VisionInputs, VisionSpec
from npu_rl.data.io import read_rows
from npu_rl.data.shapes import ShapesSpec, generate_shapes
from npu_rl.models.synthetic import tiny_image_processor, vl_char_tokenizer
from npu_rl.reward.scorers import default_compute_score


def _components(image: Image.Image) -> int:
    """Connected regions of non-white pixels (4-neighbour flood fill)."""
    ink = (np.asarray(image.convert("RGB")) < 250).any(-1)
    seen = np.zeros_like(ink)
    count = 0
    for y, x in zip(*np.nonzero(ink)):
        if seen[y, x]:
            continue
        count += 1
        stack = [(y, x)]
        seen[y, x] = True
        while stack:
            cy, cx = stack.pop()
            for ny, nx in ((cy + 1, cx), (cy - 1, cx), (cy, cx + 1), (cy, cx - 1)):
                if 0 <= ny < ink.shape[0] and 0 <= nx < ink.shape[1] and ink[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
    return count


def test_pictures_hold_the_counted_shapes():
    splits = generate_shapes(ShapesSpec(max_count=6, num_train=40, num_test=10, size=96))
    assert (len(splits["train"]), len(splits["test"])) == (40, 10)
    counts = []
    for row in splits["train"] + splits["test"]:
        image = Image.open(io.BytesIO(row["images"][0]["bytes"]))
        assert image.size == (96, 96)
        assert _components(image) == int(row["reward_model"]["ground_truth"])
        assert row["prompt"][0]["content"].count("<image>") == 1 and row["data_source"] == "shapes"
        counts.append(int(row["reward_model"]["ground_truth"]))
    assert set(counts) == set(range(1, 7))
    again = generate_shapes(ShapesSpec(max_count=6, num_train=40, num_test=10, size=96))
    assert again["train"][3]["images"] == splits["train"][3]["images"]  # deterministic in the spec
    assert splits["train"][0]["images"] != splits["test"][0]["images"]  # separate streams


def test_builtin_path_and_scorer():
    path = resolve_builtin("builtin://shapes/test?num_train=8&num_test=4&size=64")
    rows = read_rows(path)
    assert len(rows) == 4 and rows[0]["images"][0]["bytes"][:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="unknown shapes parameter 'colour'"):
        check_builtin("builtin://shapes/train?colour=1")
    with pytest.raises(ValueError, match="max_count <= 9"):
        check_builtin("builtin://shapes/train?max_count=12")
    assert default_compute_score("shapes", "There are 3 shapes.", "3")["score"] == 1.0
    assert default_compute_score("shapes", "\\boxed{2}", "3")["score"] == 0.0


def test_vl_dataset_reads_the_task():
    tokenizer = vl_char_tokenizer()
    processor = tiny_image_processor()
    vision = VisionInputs(VisionSpec.from_image_processor(processor), processor,
                          tokenizer.convert_tokens_to_ids("<|image_pad|>"))
    data = PromptDataset(resolve_builtin("builtin://shapes/train?num_train=6&num_test=2&size=64"), tokenizer,
                         vision=vision, max_prompt_length=256)
    item = data[0]
    # 64 x 64 bounded to 56 x 56 pixels -> 2 x 2 patches of 28 -> 4 patches of 14 per side, 4 merged tokens
    assert item["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert int((item["input_ids"] == vision.image_token_id).sum()) == 4
