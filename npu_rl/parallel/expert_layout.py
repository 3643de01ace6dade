"""Per-expert checkpoint tensors read as slices of transformers' stacked 3-D expert parameters.

A Hugging Face MoE checkpoint (Qwen3-30B-A3B, DeepSeek-V3, Mixtral, and what ``save_pretrained`` writes) stores one
2-D tensor per expert: ``mlp.experts.{e}.gate_proj.weight [I, H]``, ``...up_proj.weight [I, H]``,
``...down_proj.weight [H, I]``. transformers 5 holds them stacked, ``mlp.experts.gate_up_proj [E, 2I, H]`` (gate
rows then up rows) and ``mlp.experts.down_proj [E, H, I]``, converting at load by the model type's
``WeightConverter`` (``MergeModulelist(dim=0)`` then ``Concatenate(dim=1)``) and back at save.

The sharded loader reads the stacked parameter's local block (experts ``e0:e1``, rows ``r0:r1`` of dim 1, the rest
whole) straight from the per-expert tensors, each rank only its experts' bytes, using transformers' own table
(``transformers.conversion_mapping``) to know which files make which parameter. A model type whose table uses any
other operation is refused by name rather than guessed.

The other direction, for weight sync: :func:`per_expert_tensors` splits the stacked parameters of a stream back
into the checkpoint's per-expert tensors (views, no copy), since that is the layout every vLLM release's
``load_weights`` reads. vLLM 0.22's Qwen3-MoE loader, for one, knows only ``mlp.experts.{e}.gate_proj.weight`` and
passes over a stacked ``mlp.experts.gate_up_proj`` without a word (it is not among its parameters), so the engine
would keep its first experts while the actor trains them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch
from transformers.conversion_mapping import get_checkpoint_conversion_mapping
from transformers.core_model_loading import Concatenate, MergeModulelist, WeightConverter, WeightRenaming


@dataclass(frozen=True)
class StackedSource:
    """The stored tensors of one stacked parameter: ``parts[p][e]`` is expert ``e``'s tensor of part ``p`` (gate,
    up); the parts are concatenated along dim 1 of the parameter, the experts stacked along dim 0."""

    parts: tuple[tuple[str, ...], ...]


def _plain(pattern: str) -> bool:
    return not any(ch in pattern for ch in "^$[]()|+?\\")


def _converters(model_type: str | None) -> tuple[list[WeightConverter], list[tuple[str, str]]]:
    """The model type's stacking converters, and its plain renamings (checkpoint name -> model name)."""
    converters, renamings = [], []
    for transform in get_checkpoint_conversion_mapping(model_type) or []:
        if isinstance(transform, WeightRenaming) and not isinstance(transform, WeightConverter):
            renamings += [(s, t) for s, t in zip(transform.source_patterns, transform.target_patterns)
                          if _plain(s) and _plain(t)]
        elif isinstance(transform, WeightConverter):
            converters.append(transform)
    return converters, renamings


def _is_stacking(converter: WeightConverter) -> bool:
    ops = [(type(op), getattr(op, "dim", None)) for op in converter.operations]
    return ops in ([(MergeModulelist, 0)], [(MergeModulelist, 0), (Concatenate, 1)])


def stacked_source(name: str, num_experts: int, model_type: str | None, stored_name) -> StackedSource | None:
    """Where the checkpoint keeps parameter ``name`` (``[num_experts, ...]``) one expert at a time, or None when
    the model type stacks nothing there. ``stored_name(candidate)`` resolves a checkpoint name (None: absent).
    Raises when the table converts this parameter with operations this reader does not know."""
    converters, renamings = _converters(model_type)
    for converter in converters:
        target = next((t for t in converter.target_patterns if name.endswith(t.lstrip("."))), None)
        if target is None:
            continue
        if not _is_stacking(converter):
            raise ValueError(f"{name}: transformers converts it from the checkpoint with "
                             f"{[type(op).__name__ for op in converter.operations]}; the sharded loader reads only "
                             "per-expert tensors that are stacked (and concatenated): load it on one process")
        prefix = name[: len(name) - len(target.lstrip("."))]
        prefixes = [prefix] + [prefix.replace(model_side, file_side) for file_side, model_side in renamings
                               if model_side in prefix]
        parts = []
        for pattern in converter.source_patterns:
            names = []
            for expert in range(num_experts):
                candidates = [p + pattern.lstrip(".").replace("*", str(expert)) for p in prefixes]
                found = next((s for s in map(stored_name, candidates) if s is not None), None)
                if found is None:
                    return None if not parts and not names else _missing(name, candidates[0])
                names.append(found)
            parts.append(tuple(names))
        return StackedSource(tuple(parts))
    return None


def _missing(name: str, stored: str):
    raise ValueError(f"the checkpoint holds some of {name}'s per-expert tensors but not {stored!r}: a truncated or "
                     "mixed checkpoint")


def read_stacked_slice(source: StackedSource, index: tuple[slice, ...], shape: tuple[int, ...], get_slice,
                       dtype: torch.dtype) -> torch.Tensor:
    """The block ``index`` of the stacked parameter of ``shape``, read from the per-expert tensors.
    ``get_slice(stored_name)`` returns a safetensors slice handle (``[...]`` reads only those bytes)."""
    experts, rows, rest = index[0], index[1], index[2:]
    part_shapes = [tuple(get_slice(part[0]).get_shape()) for part in source.parts]
    if sum(s[0] for s in part_shapes) != shape[1] or any(s[1:] != tuple(shape[2:]) for s in part_shapes) or \
            any(len(part) != shape[0] for part in source.parts):
        raise ValueError(f"per-expert tensors {[p[0] for p in source.parts]} of shapes {part_shapes} do not stack "
                         f"into {list(shape)}: config.json and weights disagree")
    blocks = []
    for expert in range(experts.start, experts.stop):
        pieces, start = [], 0
        for part, part_shape in zip(source.parts, part_shapes):
            lo, hi = max(rows.start, start), min(rows.stop, start + part_shape[0])
            if lo < hi:
                pieces.append(get_slice(part[expert])[(slice(lo - start, hi - start), *rest)].to(dtype))
            start += part_shape[0]
        blocks.append(torch.cat(pieces) if pieces else torch.empty(0, *[s.stop - s.start for s in rest], dtype=dtype))
    if not blocks:
        return torch.empty(0, rows.stop - rows.start, *[s.stop - s.start for s in rest], dtype=dtype)
    return torch.stack(blocks)


def per_expert_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]], model_type: str | None,
                       stored_name: Callable[[str], str | None] = lambda name: name,
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` with each stacked expert parameter (``[E, ...]``) replaced by its per-expert checkpoint
    tensors, in the order gate, up (each over the experts), as views of the stacked tensor; everything else as is.

    ``stored_name(candidate)`` resolves a checkpoint name (the engine's own checkpoint's names where known, so a
    model type whose checkpoint prefix differs from transformers' module path gets the checkpoint's); the default
    takes transformers' module path. A parameter the checkpoint stores stacked (``stored_name`` finds no per-expert
    name) passes as is.
    """
    for name, tensor in named_tensors:
        source = stacked_source(name, tensor.shape[0], model_type, stored_name) if tensor.dim() == 3 else None
        if source is None:
            yield name, tensor
            continue
        if tensor.shape[1] % len(source.parts):
            raise ValueError(f"{name} {list(tensor.shape)}: dim 1 does not split into {len(source.parts)} equal "
                             f"parts ({[part[0] for part in source.parts]})")
        for part, block in zip(source.parts, tensor.chunk(len(source.parts), dim=1)):
            for expert, stored in enumerate(part):
                yield stored, block[expert]
