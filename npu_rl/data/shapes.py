"""A generated visual task: count the shapes in a picture (vision-language RL with no download, as ``arith`` is for
text).

Each row's image is ``size`` x ``size`` pixels, white, with ``min_count``..``max_count`` filled shapes (circles,
squares, triangles, drawn with PIL) of random colours, one per cell of a 3 x 3 grid (so they never overlap), placed
with a little jitter; the count is drawn uniformly. The prompt is ``<image>`` + the question, the ground truth the
count, the data source ``shapes`` (scored by the last number or ``\\boxed{}``, as ``arith``). Rows are verl's
multi-modal schema: ``images`` is a list of one ``{"bytes": <PNG>, "path": None}``, as ``datasets`` writes an image.
The train and test splits are drawn from separate random streams of ``seed``; with continuous positions and colours
no two pictures are alike, but a test picture's count and shapes can of course recur in train.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any, Optional

from PIL import Image, ImageDraw

from npu_rl.data.images import IMAGE_TAG, image_bytes

DATA_SOURCE = "shapes"
PROMPT = IMAGE_TAG + "How many shapes are in the picture? Give only the number."
KINDS = ("circle", "square", "triangle")
GRID = 3


@dataclass(frozen=True)
class ShapesSpec:
    min_count: int = 1
    max_count: int = 4
    size: int = 112  # pixels per side; the model's min/max pixels resize it
    num_train: int = 1000
    num_test: int = 100
    seed: int = 0

    def __post_init__(self):
        if not 1 <= self.min_count <= self.max_count <= GRID * GRID:
            raise ValueError(f"shapes: need 1 <= min_count <= max_count <= {GRID * GRID}, got "
                             f"{self.min_count}..{self.max_count}")
        if not 24 <= self.size <= 2048:
            raise ValueError(f"shapes: size must be within 24..2048 pixels, got {self.size}")
        if self.num_train < 1 or self.num_test < 1:
            raise ValueError("shapes: num_train and num_test must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def draw_shapes(kinds: list[str], rng: random.Random, size: int) -> Image.Image:
    """A white ``size`` x ``size`` picture with one filled shape of each of ``kinds``, in distinct grid cells."""
    image = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    cell = size / GRID
    for kind, index in zip(kinds, rng.sample(range(GRID * GRID), len(kinds))):
        radius = cell * rng.uniform(0.25, 0.4)
        cx = (index % GRID + 0.5) * cell + rng.uniform(-1, 1) * (cell / 2 - radius - 1)
        cy = (index // GRID + 0.5) * cell + rng.uniform(-1, 1) * (cell / 2 - radius - 1)
        colour = tuple(rng.randrange(0, 200) for _ in range(3))  # darker than the background
        box = (cx - radius, cy - radius, cx + radius, cy + radius)
        if kind == "circle":
            draw.ellipse(box, fill=colour)
        elif kind == "square":
            draw.rectangle(box, fill=colour)
        else:
            draw.polygon([(cx, cy - radius), (cx - radius, cy + radius), (cx + radius, cy + radius)], fill=colour)
    return image


def _row(spec: ShapesSpec, split: str, index: int, rng: random.Random) -> dict[str, Any]:
    count = rng.randint(spec.min_count, spec.max_count)
    kinds = [rng.choice(KINDS) for _ in range(count)]
    image = draw_shapes(kinds, rng, spec.size)
    answer = str(count)
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": PROMPT}],
        "images": [{"bytes": image_bytes(image), "path": None}],
        "ability": "visual_counting",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "answer": answer, "kinds": ",".join(kinds)},
    }


def generate_shapes(spec: Optional[ShapesSpec] = None) -> dict[str, list[dict[str, Any]]]:
    """``{"train": rows, "test": rows}``; deterministic in ``spec``."""
    spec = spec or ShapesSpec()
    out = {}
    for split, count in (("train", spec.num_train), ("test", spec.num_test)):
        rng = random.Random(f"{spec.seed}/{split}")
        out[split] = [_row(spec, split, i, rng) for i in range(count)]
    return out
