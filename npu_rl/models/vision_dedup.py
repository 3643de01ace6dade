"""One vision-tower computation per distinct image of a Qwen-VL forward, its output shared by the rows that carry it.

In GRPO a prompt's ``rollout.n`` rows share one ``multi_modal_inputs`` dict (npu_rl.models.vision), and a forward
that is handed pixels (:func:`~npu_rl.models.vision.multi_modal_kwargs`: the update with a trained tower, every
pass with transformers < 5.19, the hf rollout there) concatenates every row's copy: a micro-batch of 16 rows from 2
prompts ran the tower (forward, backward, checkpoint recompute) on 16 images where 2 are distinct. Here the tower
runs on the distinct ones and its outputs are expanded back to every image of the call (an ``index_select``), so the
model sees exactly what it asked for: the per-image feature count still matches its ``<|image_pad|>`` tokens. In
the update the gradient of the copies sums into the one computation (``index_select``'s backward), which is the
per-row computation's gradient: the tower treats each image alone (attention within an image's own windows and
picture, ``cu_seqlens``), so a copy's features are the original's.

How: the code that builds a forward's image inputs knows which rows share a dict (by identity) and sets a
:class:`DedupPlan` around the model call (:func:`vision_dedup`). Two hooks on the tower module (``model.model.visual``;
hooks, not a patched ``forward``, so FSDP2's own hooks on ``__call__`` are untouched) act on the calls made while a
plan is set: the pre-hook swaps ``(pixel_values, grid_thw)`` for the distinct images', the forward hook expands the
tower's output: every tensor in it (``last_hidden_state``: t*h*w rows an image, in Qwen2.5-VL's window order, which
stays within an image; ``pooler_output`` and Qwen3-VL's ``deepstack_features``: t*h*w / merge^2 rows an image), in a
tensor, tuple, list or ``ModelOutput``.

Never silently wrong: the pre-hook checks, on what the tower actually receives, that the plan holds (as many images
as the plan, their grids and patch counts add up, each copy's grid and pixels equal its original's: one comparison
and one host sync, where the tower reads ``grid_thw`` to the host anyway) and that no grid-derived tensor was
precomputed for the full set (transformers' ``cu_seqlens``, ``window_index`` ... keyword arguments); otherwise the
call computes every image, as without a plan. An output tensor that has neither row count raises, naming the switch.

``NPU_RL_VISION_DEDUP=0`` turns it off (every image computed, for A/B runs). Counters on the hook state
(:class:`TowerDedup`): images asked for and encoded under a plan, and the calls that fell back.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

import torch

from npu_rl.models.vision import vision_tower

DEDUP_ENV = "NPU_RL_VISION_DEDUP"
# transformers' vision_utils: grid-derived tensors a caller may precompute and hand the tower as keyword arguments;
# computed for the full image set, they would not fit the distinct one
PRECOMPUTED_KEYS = frozenset({"cu_seqlens", "max_seqlen", "position_ids", "window_index", "cu_window_seqlens",
                              "max_window_seqlen", "interp_indices", "interp_weights", "bilinear_indices",
                              "bilinear_weights", "merged_shape"})


def vision_dedup_enabled() -> bool:
    """``NPU_RL_VISION_DEDUP`` (default on; ``0`` / ``false`` / ``off`` turn it off)."""
    return os.environ.get(DEDUP_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


@dataclass(frozen=True)
class DedupPlan:
    """Which images of one forward's concatenated image input are copies: ``image_index[i]`` is image ``i``'s distinct
    image (numbered in first-seen order), so image ``originals[d]`` is the first with distinct image ``d``."""

    image_index: tuple[int, ...]

    @property
    def num_images(self) -> int:
        return len(self.image_index)

    @property
    def originals(self) -> tuple[int, ...]:
        first: dict[int, int] = {}
        for image, distinct in enumerate(self.image_index):
            first.setdefault(distinct, image)
        return tuple(first[d] for d in range(len(first)))


def dedup_plan(rows: Optional[Sequence[Any]]) -> Optional[DedupPlan]:
    """The plan for rows' ``multi_modal_inputs`` in the order :func:`~npu_rl.models.vision.multi_modal_kwargs`
    concatenates them (text rows left out, each row's images in order): a row's images are copies of those of the
    first row holding the same dict object. None when no image repeats (nothing to save)."""
    first_image: dict[int, int] = {}  # id(dict) -> its first image's distinct number
    index: list[int] = []
    num_distinct = 0
    for row in rows if rows is not None else []:
        if not row:
            continue
        count = len(torch.as_tensor(row["image_grid_thw"]))
        if id(row) not in first_image:
            first_image[id(row)] = num_distinct
            num_distinct += count
        index.extend(range(first_image[id(row)], first_image[id(row)] + count))
    return DedupPlan(tuple(index)) if num_distinct < len(index) else None


@dataclass
class _Expansion:
    """One planned call's output rows: per image of the call, its distinct image's rows of patches and of merged
    tokens."""

    patch_index: torch.Tensor  # [patches of the call] -> rows of the distinct images' patches
    token_index: torch.Tensor  # [merged tokens of the call] -> rows of the distinct images' merged tokens
    distinct_patches: int
    distinct_tokens: int


def _split_call(args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """(pixels, grid_thw) of a tower call ``forward(hidden_states, grid_thw, **kwargs)``, positional or keyword."""
    pixels = args[0] if args else kwargs.get("hidden_states")
    grid = args[1] if len(args) > 1 else kwargs.get("grid_thw")
    return pixels, grid


def _with_inputs(args: tuple, kwargs: dict, pixels: torch.Tensor, grid: torch.Tensor) -> tuple[tuple, dict]:
    args, kwargs = list(args), dict(kwargs)
    for position, name, value in ((0, "hidden_states", pixels), (1, "grid_thw", grid)):
        if len(args) > position:
            args[position] = value
        else:
            kwargs[name] = value
    return tuple(args), kwargs


def _ranges(sizes: list[int]) -> list[tuple[int, int]]:
    out, start = [], 0
    for size in sizes:
        out.append((start, start + size))
        start += size
    return out


class TowerDedup:
    """The hooks' state on one vision tower (installed once, :func:`install_tower_dedup`): the plan of the call in
    progress and the counters."""

    def __init__(self, tower: torch.nn.Module):
        self.merge = int(getattr(tower, "spatial_merge_size", None) or tower.config.spatial_merge_size)
        self.plan: Optional[DedupPlan] = None
        self.pending: Optional[_Expansion] = None
        self.images_requested = 0  # images of the calls made under a plan
        self.images_encoded = 0  # images the tower computed in those calls
        self.fallbacks = 0  # calls under a plan that did not match it (computed in full)

    # ------------------------------------------------------------------------------------------ the hooks
    def before(self, module, args: tuple, kwargs: dict):
        self.pending = None
        if self.plan is None:
            return None
        pixels, grid = _split_call(args, kwargs)
        planned = self._planned(pixels, grid, kwargs)
        num_images = len(grid) if isinstance(grid, torch.Tensor) and grid.dim() == 2 else 0
        self.images_requested += num_images
        if planned is None:
            self.fallbacks += 1
            self.images_encoded += num_images
            return None
        expansion, distinct_pixels, distinct_grid = planned
        self.pending = expansion
        self.images_encoded += len(distinct_grid)
        return _with_inputs(args, kwargs, distinct_pixels, distinct_grid)

    def after(self, module, args: tuple, kwargs: dict, output):
        expansion, self.pending = self.pending, None
        return _expand(output, expansion) if expansion is not None else None

    # ------------------------------------------------------------------------------------------ the check
    def _planned(self, pixels, grid, kwargs: dict) -> Optional[tuple[_Expansion, torch.Tensor, torch.Tensor]]:
        """The expansion and the distinct inputs when the call is the plan's (module docstring), else None."""
        plan = self.plan
        if not (isinstance(pixels, torch.Tensor) and isinstance(grid, torch.Tensor) and grid.dim() == 2
                and len(grid) == plan.num_images and pixels.dim() >= 1):
            return None
        if any(name in PRECOMPUTED_KEYS or isinstance(value, torch.Tensor) for name, value in kwargs.items()
               if name not in ("hidden_states", "grid_thw")):
            return None
        grids = [tuple(int(v) for v in g) for g in grid.tolist()]  # the tower reads it to the host as well
        patches = [t * h * w for t, h, w in grids]
        if sum(patches) != pixels.shape[0]:
            return None
        originals = plan.originals
        if any(grids[i] != grids[originals[d]] for i, d in enumerate(plan.image_index)):
            return None
        spans = _ranges(patches)
        copies = [(spans[i], spans[originals[d]]) for i, d in enumerate(plan.image_index) if originals[d] != i]
        device = pixels.device
        rows = [torch.arange(*copy, device=device) for copy, _ in copies]
        source = [torch.arange(*original, device=device) for _, original in copies]
        if rows and not torch.equal(pixels.index_select(0, torch.cat(rows)), pixels.index_select(0, torch.cat(source))):
            return None
        distinct_pixels = torch.cat([pixels[slice(*spans[i])] for i in originals])
        distinct_grid = grid.index_select(0, torch.tensor(originals, device=grid.device))
        return self._expansion(plan, patches, device), distinct_pixels, distinct_grid

    def _expansion(self, plan: DedupPlan, patches: list[int], device) -> _Expansion:
        originals, merge_area = plan.originals, self.merge ** 2
        distinct_spans = _ranges([patches[i] for i in originals])
        distinct_token_spans = _ranges([patches[i] // merge_area for i in originals])
        patch_index = torch.cat([torch.arange(*distinct_spans[d]) for d in plan.image_index])
        token_index = torch.cat([torch.arange(*distinct_token_spans[d]) for d in plan.image_index])
        return _Expansion(patch_index.to(device), token_index.to(device), distinct_spans[-1][1],
                          distinct_token_spans[-1][1])


def _expand(value, expansion: _Expansion):
    """``value`` (a tower output, or a part of one) with every tensor's rows of the distinct images expanded to the
    call's images; structure kept."""
    if isinstance(value, torch.Tensor):
        rows = value.shape[0] if value.dim() else None
        if rows == expansion.distinct_patches:
            return value.index_select(0, expansion.patch_index.to(value.device))
        if rows == expansion.distinct_tokens:
            return value.index_select(0, expansion.token_index.to(value.device))
        raise RuntimeError(f"vision dedup: the vision tower returned a tensor of shape {tuple(value.shape)}, which has "
                           f"neither the distinct images' {expansion.distinct_patches} patch rows nor their "
                           f"{expansion.distinct_tokens} merged-token rows, so it cannot be expanded to every row's "
                           f"images; set {DEDUP_ENV}=0 to compute every image")
    if isinstance(value, dict):  # a ModelOutput (its fields as keywords) or a plain dict
        return type(value)(**{key: _expand(item, expansion) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return type(value)(_expand(item, expansion) for item in value)
    return value


def install_tower_dedup(tower: torch.nn.Module) -> TowerDedup:
    """The tower's hook state, installing the two hooks on first use (once per module)."""
    state = getattr(tower, "_npu_rl_vision_dedup", None)
    if state is None:
        state = TowerDedup(tower)
        tower.register_forward_pre_hook(state.before, with_kwargs=True)
        tower.register_forward_hook(state.after, with_kwargs=True)
        tower._npu_rl_vision_dedup = state
    return state


def _tower(model: torch.nn.Module) -> Optional[torch.nn.Module]:
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT-wrapped
    return vision_tower(inner)


def installed_tower_dedup(model: torch.nn.Module) -> Optional[TowerDedup]:
    """The hook state of ``model``'s vision tower (its counters), or None before its first planned call."""
    tower = _tower(model)
    return getattr(tower, "_npu_rl_vision_dedup", None) if tower is not None else None


def images_deduplicated(model: torch.nn.Module) -> Optional[int]:
    """Images ``model``'s vision tower was handed but did not compute, being copies of another row's: a running
    count (0 before the first planned call); None for a model without a tower."""
    if _tower(model) is None:
        return None
    state = installed_tower_dedup(model)
    return state.images_requested - state.images_encoded if state is not None else 0


@contextlib.contextmanager
def vision_dedup(model: torch.nn.Module, rows: Optional[Sequence[Any]]) -> Iterator[Optional[TowerDedup]]:
    """Inside the block, ``model``'s vision tower computes each distinct image of ``rows`` (the ``multi_modal_inputs``
    whose pixels the model is handed, in row order) once per call (module docstring). Yields the tower's hook state,
    or None where nothing applies: the switch is off, no image repeats, or the model has no tower."""
    tower = _tower(model)
    plan = dedup_plan(rows) if tower is not None and vision_dedup_enabled() else None
    if plan is None:
        yield None
        return
    state = install_tower_dedup(tower)
    if state.plan is not None:
        raise RuntimeError("vision_dedup: a plan is already set on this vision tower (nested model calls)")
    state.plan = plan
    try:
        yield state
    finally:
        state.plan = None
        state.pending = None
