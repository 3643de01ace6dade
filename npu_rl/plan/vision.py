"""The vision tower of a Qwen-VL model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) for the planner: its parameters, the bytes
its forward keeps per image patch, its FLOPs per patch, and how many patches a job's prompts carry.

Parameters, from transformers' modules (``modeling_qwen2_vl.py``, ``modeling_qwen2_5_vl.py``, ``modeling_qwen3_vl.py``;
``h`` the tower's width, ``i`` its MLP width, ``o`` the language model's width, ``C x t x p x p`` a patch's pixels):

- patch embedding: a Conv3d ``C t p p h`` (Qwen3-VL: with a bias, ``+ h``); Qwen3-VL adds a learned position grid
  (``num_position_embeddings x h``);
- a block: two norms (RMSNorm ``h`` in Qwen2.5-VL; LayerNorm ``2h`` in the others), ``qkv`` ``3h^2 + 3h``, ``proj``
  ``h^2 + h``, the MLP: gated SiLU with biases in Qwen2.5-VL (``3hi + 2i + h``), two linears in the others
  (``2hi + i + h``; Qwen2-VL's ``i = h x mlp_ratio``);
- the merger: a norm over ``h`` (RMSNorm ``h`` / LayerNorm ``2h``), then ``4h -> 4h -> o`` with biases (every
  ``merge^2`` = 4 patches become one image token); Qwen3-VL's deepstack mergers the same with a LayerNorm over ``4h``.

Saved for backward per patch (bf16, ``saved_tensors_hooks`` deduplicated by storage, parameters left out; measured
on this machine with transformers 5.19 at two widths and two MLP widths per family, exact and linear in the patches,
``tests/plan/test_vision_plan.py`` keeps the check): a block keeps ``30h + 8i`` (Qwen2.5-VL: the RMSNorms' fp32
inputs, the fp32 rotary q / k, the gated MLP's four tensors), ``22h + 6i`` (Qwen2-VL), ``22h + 4i`` (Qwen3-VL), plus
``4 heads + 8`` (the attention's log-sum-exp); with gradient checkpointing a block keeps its input only (``2h``) and
one block at a time is recomputed. Outside the blocks: the pixels (``2 C t p p``), the rotary cos / sin (``8
head_dim``, inside the checkpointed blocks when on), the merger (``12h`` / ``8h`` / ``8h``), each deepstack merger
``6h + 1``, index tensors (``INDEX_SAVED``: 4-52 bytes).

A forward without gradient (log-probs, the reference, the rollout's prefill) holds one block's tensors at a time;
its peak per patch, measured with torch's profiler (``profile_memory=True``: every CPU allocation and free, the
running total's peak; bf16, slopes between two picture sizes, widths and MLP widths varied): the larger of the
attention's moment (the qkv output, fp32 q / k and their rotations: ``34h``; Qwen3-VL ``42h + 64``, which includes
its position-grid interpolation) and the MLP's (``6h + 6i``; Qwen3-VL ``10h + 4i``),
plus the rotary tables (``8 head_dim``) and a few bytes (``tests/plan/test_vision_plan.py`` keeps the check).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from urllib.parse import parse_qs, urlparse

from npu_rl.data.images import VisionSpec, smart_resize

# the tower's saved bytes per patch and block, per family: (per h, per i) (module docstring)
BLOCK_SAVED = {"qwen2_vl": (22, 6), "qwen2_5_vl": (30, 8), "qwen3_vl": (22, 4)}
MERGER_SAVED = {"qwen2_vl": 8, "qwen2_5_vl": 12, "qwen3_vl": 8}  # per h
DEEPSTACK_SAVED = 6  # per h, each Qwen3-VL deepstack merger (its input is the next block's), and 1 byte
# index tensors per patch: Qwen2.5-VL's window permutation (int64), Qwen3-VL's position-grid interpolation (4 int64
# indices, 4 fp32 weights: 48) and, in Qwen2-VL / Qwen3-VL, 4 bytes measured but not traced to a tensor
INDEX_SAVED = {"qwen2_vl": 4, "qwen2_5_vl": 8, "qwen3_vl": 52}
FAMILIES = {"qwen2_vl": "qwen2_vl", "qwen2_5_vl": "qwen2_5_vl", "qwen3_vl": "qwen3_vl", "qwen3_vl_moe": "qwen3_vl"}


@dataclass(frozen=True)
class VisionShape:
    """A Qwen-VL vision tower's sizes (its config.json's ``vision_config``, transformers' defaults filled in)."""

    family: str  # qwen2_vl | qwen2_5_vl | qwen3_vl
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int  # the language model's width: what the merger writes
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    window_size: int = 0  # Qwen2.5-VL: window attention over window_size pixels a side ...
    num_full_attention_blocks: int = 0  # ... except in these blocks (fullatt_block_indexes)
    num_position_embeddings: int = 0  # Qwen3-VL's learned position grid
    num_deepstack: int = 0  # Qwen3-VL's deepstack mergers

    # ---- parameters
    @property
    def _norm(self) -> int:
        """One norm's parameters: RMSNorm (Qwen2.5-VL) or LayerNorm."""
        return self.hidden_size * (1 if self.family == "qwen2_5_vl" else 2)

    @property
    def patch_embed_params(self) -> int:
        h = self.hidden_size
        conv = self.in_channels * self.temporal_patch_size * self.patch_size ** 2 * h
        return conv + (h if self.family == "qwen3_vl" else 0) + self.num_position_embeddings * h

    @property
    def block_params(self) -> int:
        h, i = self.hidden_size, self.intermediate_size
        mlp = 3 * h * i + 2 * i + h if self.family == "qwen2_5_vl" else 2 * h * i + i + h
        return 2 * self._norm + 3 * h * h + 3 * h + h * h + h + mlp

    def _merger_params(self, norm: int) -> int:
        wide = self.hidden_size * self.spatial_merge_size ** 2
        return norm + wide * wide + wide + wide * self.out_hidden_size + self.out_hidden_size

    @property
    def merger_params(self) -> int:
        """The merger and the deepstack mergers."""
        deepstack = self._merger_params(2 * self.hidden_size * self.spatial_merge_size ** 2)
        return self._merger_params(self._norm) + self.num_deepstack * deepstack

    @property
    def root_params(self) -> int:
        """What FSDP2's root group holds of the tower (each block is its own group): patch embedding, mergers."""
        return self.patch_embed_params + self.merger_params

    @property
    def num_params(self) -> int:
        return self.root_params + self.depth * self.block_params

    # ---- per image
    @property
    def factor(self) -> int:
        """Pixels a side of one image token (patch x merge)."""
        return self.patch_size * self.spatial_merge_size

    def patches(self, height: int, width: int, min_pixels: int, max_pixels: int) -> int:
        """Patches of one ``height x width`` picture after Qwen's resize (npu_rl.data.images.smart_resize)."""
        h, w = smart_resize(height, width, self.factor, min_pixels, max_pixels)
        return (h // self.patch_size) * (w // self.patch_size)

    def image_tokens(self, patches: int) -> int:
        return patches // self.spatial_merge_size ** 2

    # ---- memory per patch
    @property
    def _head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def block_saved_bytes(self) -> int:
        """One block's saved tensors per patch without checkpointing (bf16)."""
        per_h, per_i = BLOCK_SAVED[self.family]
        return per_h * self.hidden_size + per_i * self.intermediate_size + 4 * self.num_heads + 8

    def saved_bytes_per_patch(self, checkpointing: bool) -> int:
        """The whole tower's saved tensors per patch (bf16; module docstring)."""
        h = self.hidden_size
        outside = (2 * self.in_channels * self.temporal_patch_size * self.patch_size ** 2
                   + MERGER_SAVED[self.family] * h + (DEEPSTACK_SAVED * h + 1) * self.num_deepstack
                   + INDEX_SAVED[self.family])
        if checkpointing:
            return outside + self.depth * 2 * h
        return outside + 8 * self._head_dim + self.depth * self.block_saved_bytes()

    def working_bytes_per_patch(self) -> int:
        """A forward without gradient: its peak per patch (module docstring; measured)."""
        h, i, rotary = self.hidden_size, self.intermediate_size, 8 * self._head_dim
        if self.family == "qwen3_vl":
            return max(42 * h + 64, 10 * h + 4 * i + rotary + 96)
        return max(34 * h, 6 * h + 6 * i) + rotary + (16 if self.family == "qwen2_vl" else 18)

    def feature_bytes_per_patch(self) -> int:
        """The merged features a forward hands the language model (bf16), deepstack's included."""
        return 2 * self.out_hidden_size * (1 + self.num_deepstack) // self.spatial_merge_size ** 2

    # ---- FLOPs per patch
    def forward_flops_per_patch(self, patches_per_image: int) -> float:
        """Matmul FLOPs of one patch's forward: patch embedding, blocks (attention over the window's or the
        image's patches), merger (per merged token)."""
        h = self.hidden_size
        window = self.window_size // self.patch_size
        window_patches = min(window * window, patches_per_image) if window else patches_per_image
        full = self.num_full_attention_blocks if self.window_size else self.depth
        attention = 4 * h * (full * patches_per_image + (self.depth - full) * window_patches)
        block_matmul = self.block_params - 2 * self._norm  # the linears (biases are a rounding error)
        merger = (self.merger_params - self.num_deepstack * 2 * h * 4 - self._norm) / self.spatial_merge_size ** 2
        embed = self.in_channels * self.temporal_patch_size * self.patch_size ** 2 * h
        return 2.0 * (embed + self.depth * block_matmul + merger) + attention


def vision_shape_from_config(cfg: dict, source: str = "config.json") -> VisionShape | None:
    """The vision tower of a Qwen-VL config.json's contents (None for any other model): transformers' own config
    class reads it, so its defaults and key aliases (``in_chans``) are the model's."""
    family = FAMILIES.get(str(cfg.get("model_type", "")))
    if family is None or not isinstance(cfg.get("vision_config"), dict):
        return None
    from transformers import AutoConfig  # a config class, no model: cheap, and exact about the defaults

    try:
        vision = AutoConfig.for_model(**cfg).vision_config
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"{source}: its vision_config is not one transformers reads ({type(exc).__name__}: "
                         f"{str(exc)[:200]})") from None
    common = dict(family=family, depth=int(vision.depth), num_heads=int(vision.num_heads),
                  patch_size=int(vision.patch_size), temporal_patch_size=int(vision.temporal_patch_size),
                  spatial_merge_size=int(vision.spatial_merge_size), in_channels=int(vision.in_channels))
    if family == "qwen2_vl":  # embed_dim is the tower's width, hidden_size the language model's
        return VisionShape(hidden_size=int(vision.embed_dim), intermediate_size=int(vision.embed_dim *
                           vision.mlp_ratio), out_hidden_size=int(vision.hidden_size), **common)
    extra = {}
    if family == "qwen2_5_vl":
        extra = dict(window_size=int(vision.window_size),
                     num_full_attention_blocks=len(vision.fullatt_block_indexes or ()))
    else:
        extra = dict(num_position_embeddings=int(vision.num_position_embeddings),
                     num_deepstack=len(vision.deepstack_visual_indexes or ()))
    return VisionShape(hidden_size=int(vision.hidden_size), intermediate_size=int(vision.intermediate_size),
                       out_hidden_size=int(vision.out_hidden_size), **common, **extra)


# ---------------------------------------------------------------------------------------------- the job's images
VISION_ENCODE_MODES = ("once", "per-micro-batch", "per-row")  # npu-rl plan --vision-encode


@dataclass(frozen=True)
class ImageLoad:
    """The images a job's prompts carry, as the planner assumes them, and how often the tower runs on them
    (``--vision-encode``, :data:`VISION_ENCODE_MODES`).

    ``encode_once``: transformers >= 5.19 (``mm_encoder_outputs``): the log-prob and reference passes, the update
    with a frozen tower and the hf rollout encode each prompt's images once per pass (docs/vl.md).
    ``dedup``: a forward that is handed pixels (the update of a trained tower; every pass without ``encode_once``)
    runs the tower on its micro-batch's distinct prompts' images only (npu_rl/models/vision_dedup.py): about
    :func:`prompts_in_micro_batch` prompts a micro-batch instead of one a row.
    Modes: ``once`` = both; ``per-micro-batch`` = dedup only (transformers < 5.19); ``per-row`` = neither, every row
    (each of a prompt's ``n`` samples) encodes its own in every micro-batch (the code before the dedup, or
    ``NPU_RL_VISION_DEDUP=0`` with transformers < 5.19)."""

    images_per_prompt: int
    patches_per_image: int
    source: str  # what the numbers were taken from (printed)
    encode_once: bool
    dedup: bool = True

    @property
    def patches_per_prompt(self) -> int:
        return self.images_per_prompt * self.patches_per_image

    @property
    def mode(self) -> str:
        """The ``--vision-encode`` mode these flags are (``once`` without dedup: ``once, per-row updates``)."""
        if self.encode_once:
            return "once" if self.dedup else "once, per-row updates"
        return "per-micro-batch" if self.dedup else "per-row"


def prompts_in_micro_batch(rows: int, n: int, grouped: bool = True) -> int:
    """Prompts whose images a micro-batch of ``rows`` rows carries, as the planner assumes: the rollout puts a
    prompt's ``n`` samples side by side, so consecutive rows span ``ceil(rows / n)`` prompts (at least 1; one while
    ``rows`` <= ``n``). A micro-batch that straddles a prompt boundary carries one more, and ``trainer.balance_batch``
    over several ranks deals a prompt's samples out to them: both are left out. Rows that were regrouped
    (``grouped=False``: ``actor.shuffle``, token-budget micro-batches) are assumed to be all different prompts."""
    rows = max(rows, 1)
    return max(1, math.ceil(rows / max(n, 1))) if grouped else rows


def shapes_image_side(train_files) -> int | None:
    """The picture side of the shipped ``builtin://shapes`` task named in ``data.train_files`` (its ``size``
    parameter, default 112), or None when the files are something else."""
    files = [train_files] if isinstance(train_files, str) else list(train_files or [])
    for name in files:
        text = str(name).strip("'\"")
        if text.startswith("builtin://shapes"):
            query = parse_qs(urlparse(text).query)
            return int(query["size"][0]) if "size" in query else 112
    return None


def pixel_bounds(processor_config: dict | None, mm_processor_kwargs: dict | None) -> tuple[int, int]:
    """(min_pixels, max_pixels) as the data set reads them: ``data.mm_processor_kwargs`` over the model's
    preprocessor_config.json over the data layer's defaults (npu_rl.data.images.VisionSpec)."""
    processor = dict(processor_config or {})
    size = processor.get("size") if isinstance(processor.get("size"), dict) else {}
    kwargs = dict(mm_processor_kwargs or {})
    low = kwargs.get("min_pixels") or processor.get("min_pixels") or size.get("shortest_edge") or VisionSpec.min_pixels
    high = kwargs.get("max_pixels") or processor.get("max_pixels") or size.get("longest_edge") or VisionSpec.max_pixels
    return int(low), int(high)


def transformers_encodes_once() -> bool:
    """Whether this machine's transformers takes precomputed vision features (``mm_encoder_outputs``, >= 5.19)."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    return "mm_encoder_outputs" in inspect.signature(Qwen2_5_VLModel.forward).parameters


def image_load(vision: VisionShape, *, images_per_prompt: int | None, image_size: tuple[int, int] | None,
               train_files, max_prompt_length: int, bounds: tuple[int, int], encode_once: bool,
               dedup: bool = True) -> ImageLoad:
    """The job's images: as told (``--images-per-prompt``, ``--image-size``), else the shipped shapes task's picture
    size, else one picture at ``max_pixels`` (the largest the data set resizes to), fewer patches if its tokens
    would pass ``data.max_prompt_length`` (such prompts are refused or dropped)."""
    images = 1 if images_per_prompt is None else images_per_prompt
    if images < 0:
        raise ValueError(f"--images-per-prompt {images}: expected >= 0")
    low, high = bounds
    if image_size is not None:
        height, width = image_size
        if height <= 0 or width <= 0:
            raise ValueError(f"--image-size {width}x{height}: expected positive sides")
        patches = vision.patches(height, width, low, high)
        source = f"--image-size {width}x{height}"
    elif (side := shapes_image_side(train_files)) is not None:
        patches = vision.patches(side, side, low, high)
        source = f"builtin://shapes pictures of {side}x{side}"
    else:
        patches = high // vision.patch_size ** 2 // vision.spatial_merge_size ** 2 * vision.spatial_merge_size ** 2
        cap = max_prompt_length // max(images, 1) * vision.spatial_merge_size ** 2
        source = (f"one picture of max_pixels={high} (the most the data set resizes to: give --image-size for the "
                  "data's own)") if images_per_prompt is None else f"pictures of max_pixels={high}"
        if patches > cap:
            patches = cap
            source += f", cut to data.max_prompt_length={max_prompt_length} tokens"
    if images_per_prompt is not None:
        source += f", --images-per-prompt {images}"
    return ImageLoad(images, patches, source, encode_once, dedup)


def parse_image_size(text: str | None) -> tuple[int, int] | None:
    """``--image-size``: ``448`` (square) or ``640x480`` (width x height) -> (height, width)."""
    if text is None:
        return None
    parts = text.lower().split("x")
    try:
        sides = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"--image-size {text!r}: expected a side in pixels (448) or WIDTHxHEIGHT (640x480)") from None
    if len(sides) == 1:
        return sides[0], sides[0]
    if len(sides) == 2:
        return sides[1], sides[0]
    raise ValueError(f"--image-size {text!r}: expected a side in pixels (448) or WIDTHxHEIGHT (640x480)")

