"""Batches of prompts as ``Batch`` objects, from a data loader whose position can be saved and restored exactly.

Collation left-pads (generation appends on the right):

    input_ids       [B, P]  pad id on the left (the tokenizer's pad, else its eos)
    attention_mask  [B, P]  1 on prompt tokens
    position_ids    [B, P]  0.. over prompt tokens, 0 on padding
    non-tensors     raw_prompt_ids (unpadded ids, what vLLM takes), data_source, ground_truth, extra_info, index,
                    uid (one fresh id per prompt: GRPO groups the rollout.n samples of a prompt by it),
                    raw_prompt / full_prompts when asked, and the reward_fn_key column when it is not data_source

P is the longest prompt of the batch (at most max_prompt_length). With images (a Qwen-VL actor), ``position_ids``
is [B, 3, P] (the 3-D rotary ids, ``npu_rl.data.images.mrope_position_ids``) and ``multi_modal_inputs`` a
non-tensor per row (its ``pixel_values`` and ``image_grid_thw``; empty for a text row).

Resumption: the order of epoch ``e`` is a permutation drawn from ``(seed, e)`` alone, so the position is just
``(epoch, batches handed out this epoch)``. ``state_dict()`` taken after the trainer received batch k of an epoch
resumes at batch k+1; taken after the last batch of an epoch it resumes at the first batch of the next epoch,
shuffled as that epoch. Each ``iter()`` continues from the current position; finishing a pass advances the epoch.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import torch

from npu_rl.data.dataset import PromptDataset, object_array
from npu_rl.data.images import VisionInputs, mrope_position_ids
from npu_rl.data.sources import resolve_data_files
from npu_rl.protocol import Batch

logger = logging.getLogger(__name__)

STATE_VERSION = 1


def pad_id_of(tokenizer) -> int:
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None)
        if value is not None:
            return int(value)
    return 0


class PromptCollator:
    """Items of ``PromptDataset`` -> one left-padded ``Batch`` (picklable, so data-loader workers can run it)."""

    def __init__(self, pad_token_id: int, vision: Optional[VisionInputs] = None):
        self.pad_token_id = pad_token_id
        self.image_token_id = vision.image_token_id if vision is not None else None
        self.merge_size = vision.spec.merge_size if vision is not None else None

    def __call__(self, items: Sequence[dict[str, Any]]) -> Batch:
        lengths = [len(item["input_ids"]) for item in items]
        width = max(lengths)
        input_ids = torch.full((len(items), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(items), width), dtype=torch.long)
        for row, (item, length) in enumerate(zip(items, lengths)):
            if length:
                input_ids[row, width - length :] = torch.as_tensor(item["input_ids"], dtype=torch.long)
                attention_mask[row, width - length :] = 1
        if self.image_token_id is None:
            position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)  # [B, P]
        else:
            grids = [item["multi_modal_inputs"]["image_grid_thw"] for item in items if item["multi_modal_inputs"]]
            position_ids = mrope_position_ids(input_ids, attention_mask, torch.cat(grids) if grids else None,
                                              self.image_token_id, self.merge_size)  # [B, 3, P]
        non_tensors = {"raw_prompt_ids": object_array([list(map(int, item["input_ids"])) for item in items])}
        for key in items[0]:
            if key != "input_ids":
                non_tensors[key] = object_array([item.get(key) for item in items])
        non_tensors["uid"] = object_array([str(uuid.uuid4()) for _ in items])
        tensors = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        return Batch(tensors, non_tensors)


class _Rows:
    """Adapter for torch's DataLoader: ``batch_sampler`` yields index lists, this fetches the items."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __getitem__(self, i):
        return self.dataset[i]

    def __len__(self):
        return len(self.dataset)


class PromptDataLoader:
    """Shuffled (or ordered) batches of a data set, resumable mid-epoch and at epoch boundaries."""

    def __init__(self, dataset, batch_size: int, *, collate_fn: Callable[[Sequence[dict]], Batch],
                 shuffle: bool = True, seed: int = 1, drop_last: bool = True, num_workers: int = 0):
        if batch_size <= 0:
            raise ValueError(f"batch size must be positive, got {batch_size}")
        if num_workers < 0:
            raise ValueError(f"data.dataloader_num_workers must be >= 0, got {num_workers}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.num_workers = num_workers
        self.epoch = 0
        self.batches_done = 0  # batches of the current epoch already handed out
        self._generation = 0  # bumped by load_state_dict: an iterator from before it stops
        if len(self) == 0:
            raise ValueError(f"the data set has {len(dataset)} prompts, fewer than one batch of {batch_size} "
                             "(with drop_last); lower the batch size or add data")

    def __len__(self) -> int:
        """Batches per epoch."""
        if self.drop_last:
            return len(self.dataset) // self.batch_size
        return -(-len(self.dataset) // self.batch_size)

    def epoch_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.dataset))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.dataset))

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        order = self.epoch_order(epoch).tolist()
        return [order[i : i + self.batch_size] for i in range(0, len(self) * self.batch_size, self.batch_size)]

    def __iter__(self) -> Iterator[Batch]:
        generation = self._generation
        batches = self.epoch_batches(self.epoch)[self.batches_done :]
        for batch in self._fetch(batches):
            if generation != self._generation:
                return  # the position was reloaded: this iterator is stale
            self.batches_done += 1  # counted before handing out: a checkpoint taken now resumes after this batch
            if self.batches_done == len(self):
                self.epoch, self.batches_done = self.epoch + 1, 0
            yield batch

    def _fetch(self, batches: list[list[int]]) -> Iterator[Batch]:
        if not batches:
            return iter(())
        if self.num_workers == 0:
            return (self.collate_fn([self.dataset[i] for i in indices]) for indices in batches)
        loader = torch.utils.data.DataLoader(_Rows(self.dataset), batch_sampler=batches, collate_fn=self.collate_fn,
                                             num_workers=self.num_workers)
        return iter(loader)

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "epoch": self.epoch, "batches_done": self.batches_done,
                "seed": self.seed, "shuffle": self.shuffle, "batch_size": self.batch_size,
                "num_rows": len(self.dataset)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("num_rows", "batch_size", "seed", "shuffle"):
            saved, now = state.get(key), getattr(self, key) if key != "num_rows" else len(self.dataset)
            if saved is not None and saved != now:
                raise ValueError(f"cannot resume the data loader: the checkpoint has {key}={saved}, this run has "
                                 f"{now}; the data or the data config changed since the checkpoint")
        epoch, done = int(state["epoch"]), int(state["batches_done"])
        if not 0 <= done <= len(self):
            raise ValueError(f"data loader state has batches_done={done}, outside 0..{len(self)}")
        if done == len(self):  # a state saved by hand at the very end of an epoch
            epoch, done = epoch + 1, 0
        self.epoch, self.batches_done = epoch, done
        self._generation += 1


def build_dataset(data_config, tokenizer, split: str = "train", files: Any = None,
                  require_ground_truth: bool = True, vision: Optional[VisionInputs] = None) -> PromptDataset:
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    if files is None:
        files = data_config.train_files if split == "train" else data_config.val_files

    return PromptDataset(
        resolve_data_files(files, "train" if split == "train" else "validation"),
        tokenizer,
        prompt_key=data_config.prompt_key,
        max_prompt_length=data_config.max_prompt_length,
        truncation=data_config.truncation,
        filter_overlong_prompts=data_config.filter_overlong_prompts,
        return_raw_chat=data_config.return_raw_chat,
        return_full_prompt=data_config.return_full_prompt,
        apply_chat_template_kwargs=dict(data_config.apply_chat_template_kwargs or {}),
        reward_fn_key=data_config.reward_fn_key,
        require_ground_truth=require_ground_truth,
        image_key=data_config.image_key,
        vision=vision,
    )


def build_dataloader(data_config, tokenizer, split: str = "train", *, batch_size: Optional[int] = None,
                     files: Any = None, num_workers: Optional[int] = None, dataset: Optional[PromptDataset] = None,
                     require_ground_truth: bool = True, vision: Optional[VisionInputs] = None) -> PromptDataLoader:
    """The data loader for ``data.train_files`` (``split="train"``) or ``data.val_files`` (``"val"``).

    Train: ``batch_size`` defaults to ``data.gen_batch_size`` or else ``data.train_batch_size`` prompts (times
    ``data.oversample_factor``, PRIME's oversampling, 1 elsewhere: validation refuses it outside PRIME), shuffled
    with ``data.seed`` when ``data.shuffle``, the last partial batch dropped. Val: ``data.val_batch_size`` or the
    whole set in one batch, shuffled only when ``data.validation_shuffle``, nothing dropped.
    """
    dataset = dataset or build_dataset(data_config, tokenizer, split, files, require_ground_truth, vision)
    if split == "train":
        size = batch_size or data_config.gen_batch_size or \
            int(data_config.train_batch_size * data_config.oversample_factor)
        shuffle, drop_last = bool(data_config.shuffle), True
    else:
        size = batch_size or data_config.val_batch_size or len(dataset)
        shuffle, drop_last = bool(data_config.validation_shuffle), False
    workers = data_config.dataloader_num_workers if num_workers is None else num_workers
    collate = PromptCollator(pad_id_of(tokenizer), getattr(dataset, "vision", None))
    return PromptDataLoader(dataset, int(size), collate_fn=collate, shuffle=shuffle, seed=int(data_config.seed),
                            drop_last=drop_last, num_workers=int(workers))
