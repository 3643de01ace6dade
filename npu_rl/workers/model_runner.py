"""Shared by the actor, reference and critic workers: build a model on this rank's device (sharded when the world
is larger than one), split a batch into micro-batches (fixed size or a token budget), and run forwards with the
padding trimmed.

Trimming: prompts are left-padded to ``max_prompt_length`` and responses right-padded to ``max_response_length``,
so most micro-batches carry columns of padding on both sides. Columns that are padding in every row are cut before
the forward and the outputs padded back, which changes no value (attention masks exclude those columns) and on
short prompts saves most of the work.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from npu_rl.device import get_backend
from npu_rl.models.loader import to_dtype
from npu_rl.protocol import Batch


@dataclass
class MicroBatching:
    micro_batch_size: int | None = None  # rows per micro-batch (None: the whole batch)
    use_dynamic_bsz: bool = False
    max_token_len: int = 16384  # token budget per micro-batch when use_dynamic_bsz


def split_micro_batches(batch: Batch, how: MicroBatching) -> tuple[list[Batch], list[int] | None]:
    """Micro-batches, and (for token-budget batches, which reorder rows) the permutation to restore order."""
    if how.use_dynamic_bsz:
        from npu_rl.parallel import split_by_token_budget

        return split_by_token_budget(batch, how.max_token_len)
    size = how.micro_batch_size or len(batch)
    return batch.split(size), None


def restore_order(outputs: list[torch.Tensor], permutation: list[int] | None) -> torch.Tensor:
    """Concatenate micro-batch outputs and undo a token-budget reordering."""
    out = torch.cat(outputs)
    if permutation is None:
        return out
    inverse = torch.empty(len(permutation), dtype=torch.long)
    inverse[torch.as_tensor(permutation)] = torch.arange(len(permutation))
    return out[inverse.to(out.device)]


def trimmed_inputs(mb: Batch, response_length: int) -> tuple[dict[str, torch.Tensor], int]:
    """Forward inputs with all-padding columns cut; returns them and the kept response width."""
    attention_mask = mb["attention_mask"]  # [b, P + R]
    prompt_width = attention_mask.shape[1] - response_length
    prompt_valid = attention_mask[:, :prompt_width].any(dim=0)
    first = int(prompt_valid.nonzero()[0]) if prompt_valid.any() else prompt_width - 1
    response_valid = mb["response_mask"].any(dim=0) if "response_mask" in mb else attention_mask[:, prompt_width:].any(0)
    kept = int(response_valid.nonzero()[-1]) + 1 if response_valid.any() else 1
    cols = slice(first, prompt_width + kept)
    inputs = {k: mb[k][:, cols] for k in ("input_ids", "attention_mask", "position_ids")}
    inputs["responses"] = mb["responses"][:, :kept]
    return inputs, kept


def pad_right(values: torch.Tensor, width: int) -> torch.Tensor:
    """[b, kept] -> [b, width] with zeros."""
    if values.shape[1] == width:
        return values
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


class ModelRunner:
    """A model on this rank's device with its precision settings; parallelism is applied afterwards."""

    def __init__(self, model: torch.nn.Module, fsdp_config, world_size: int = 1):
        self.backend = get_backend()
        self.device = self.backend.device()
        self.param_dtype = to_dtype(fsdp_config.mixed_precision.param_dtype)
        self.world_size = world_size
        if world_size > 1:
            from npu_rl.parallel import apply_fsdp2

            self.model = apply_fsdp2(model, fsdp_config)
        else:
            self.model = model.to(self.device)

    def autocast(self):
        """Mixed precision on one device: FSDP2's MixedPrecisionPolicy does it when sharded."""
        model_dtype = next(self.model.parameters()).dtype
        if self.world_size > 1 or self.param_dtype == model_dtype:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.param_dtype)
