"""The prompt data set: verl-schema rows (parquet or JSONL) -> tokenized prompts plus what the reward needs.

Every row needs the prompt (``data.prompt_key``: a list of ``{role, content}`` messages, or a plain string taken as
one user message) and, unless told otherwise, a ground truth (``reward_model.ground_truth``, or a top-level
``ground_truth``). The prompt is rendered with the tokenizer's chat template (generation prompt added,
``data.apply_chat_template_kwargs`` passed through); a tokenizer without a template gets the message contents
joined by newlines. Prompts longer than ``max_prompt_length`` tokens are dropped when ``filter_overlong_prompts``
(counted in ``num_filtered``, a WARNING with the count), else handled by ``truncation``: ``error`` (fail naming file
and row), ``left`` (keep the end), ``right`` (keep the start; this cuts the assistant header off, said in the
warning) or ``middle`` (keep both ends, as verl); truncated rows are counted in ``num_truncated`` and warned about.

All prompts are rendered and tokenized once, when the data set is built, so a bad row fails before training starts.

Images (``vision`` given: a Qwen-VL actor; ``npu_rl.data.images``): a row's ``data.image_key`` list and the
``<image>`` tags of its messages are checked and each tag expanded to the image's vision block when the set is
built, from the images' headers; pixels are decoded when an item is taken (``multi_modal_inputs``: the row's
``pixel_values`` and ``image_grid_thw``). A prompt with images is never truncated (cutting an image block breaks
the model's input): it fails naming the row, or is dropped by ``filter_overlong_prompts``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

import os

from npu_rl.data.images import VisionInputs, expand_image_tags, images_of, open_image, row_image_problem
from npu_rl.data.sources import resolve_data_files
from npu_rl.data.io import DataError, read_rows

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "left", "right", "middle")
_TOKENIZE_CHUNK = 1024


@dataclass(frozen=True)
class RowSource:
    path: str
    row: int

    def __str__(self) -> str:
        return f"{self.path}: row {self.row}"


def _to_messages(prompt: Any, where: RowSource, prompt_key: str) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, (list, tuple, np.ndarray)):
        messages = []
        for j, message in enumerate(prompt):
            if not isinstance(message, dict) or "content" not in message or "role" not in message:
                raise DataError(f"{where}: {prompt_key}[{j}] must be a dict with 'role' and 'content', got {message!r}")
            if not isinstance(message["content"], str):
                raise DataError(f"{where}: {prompt_key}[{j}].content is a {type(message['content']).__name__}, "
                                 "expected a string")
            messages.append({"role": str(message["role"]), "content": message["content"]})
    else:
        raise DataError(f"{where}: {prompt_key!r} is a {type(prompt).__name__}; expected a list of chat messages "
                         "or a string")
    if not messages or not any(m["content"].strip() for m in messages):
        raise DataError(f"{where}: {prompt_key!r} is empty")
    return messages


def ground_truth_of(row: dict[str, Any]) -> Any:
    reward_model = row.get("reward_model")
    if isinstance(reward_model, dict) and reward_model.get("ground_truth") is not None:
        return reward_model["ground_truth"]
    return row.get("ground_truth")


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip()) or (
        isinstance(value, float) and math.isnan(value))


class PromptDataset:
    """Tokenized prompts of one or more files; ``dataset[i]`` is a dict that ``collate_prompts`` batches."""

    def __init__(
        self,
        files: Any,
        tokenizer,
        *,
        prompt_key: str = "prompt",
        max_prompt_length: int = 512,
        truncation: str = "error",
        filter_overlong_prompts: bool = False,
        return_raw_chat: bool = False,
        return_full_prompt: bool = False,
        apply_chat_template_kwargs: Optional[dict[str, Any]] = None,
        reward_fn_key: str = "data_source",
        require_ground_truth: bool = True,
        image_key: str = "images",
        vision: Optional[VisionInputs] = None,
    ):
        if truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation must be one of {TRUNCATION_MODES}, got {truncation!r}")
        if max_prompt_length <= 0:
            raise ValueError(f"data.max_prompt_length must be positive, got {max_prompt_length}")
        self.tokenizer = tokenizer
        self.prompt_key = prompt_key
        self.max_prompt_length = max_prompt_length
        self.truncation = truncation
        self.return_raw_chat = return_raw_chat
        self.return_full_prompt = return_full_prompt
        self.reward_fn_key = reward_fn_key
        self.chat_kwargs = dict(apply_chat_template_kwargs or {})
        self.image_key = image_key
        self.vision = vision
        self.files = resolve_data_files(files)

        rows, sources, messages = self._load(require_ground_truth)
        texts = [self._with_images(self.render(m), row, where) for m, row, where in zip(messages, rows, sources)]
        token_ids = self._tokenize(texts)
        keep = [i for i, ids in enumerate(token_ids) if len(ids) <= max_prompt_length] if filter_overlong_prompts \
            else list(range(len(rows)))
        self.num_filtered = len(rows) - len(keep)
        if self.num_filtered:
            logger.warning("data.filter_overlong_prompts: dropped %d of %d prompts longer than "
                           "max_prompt_length=%d tokens (%s; first: %s)", self.num_filtered, len(rows),
                           max_prompt_length, ", ".join(self.files),
                           next(sources[i] for i, ids in enumerate(token_ids) if len(ids) > max_prompt_length))
        if not keep:
            raise DataError(f"no prompts left in {self.files} (all {len(rows)} are longer than "
                             f"max_prompt_length={max_prompt_length} tokens)")
        self.rows = [rows[i] for i in keep]
        self.sources = [sources[i] for i in keep]
        self.messages = [messages[i] for i in keep]
        self.texts = [texts[i] for i in keep]
        for i in keep:
            if len(token_ids[i]) > max_prompt_length and images_of(rows[i], image_key):
                raise ValueError(f"{sources[i]}: the prompt with its images is {len(token_ids[i])} tokens, longer "
                                 f"than data.max_prompt_length={max_prompt_length}; a prompt with images is never "
                                 "truncated. Raise max_prompt_length, lower the images' max_pixels "
                                 "(data.mm_processor_kwargs.max_pixels), or set data.filter_overlong_prompts=True")
        self.token_ids = [self._truncate(token_ids[i], sources[i]) for i in keep]
        cut = [sources[i] for i in keep if len(token_ids[i]) > max_prompt_length]
        self.num_truncated = len(cut)
        if cut:
            lost = (" Their ends are gone, with the assistant header the chat template puts last: the model continues "
                    "the user's text instead of answering. Prefer data.truncation=left|middle, or "
                    "data.filter_overlong_prompts=True." if truncation == "right" else "")
            logger.warning("data.truncation=%s cut %d of %d prompts to data.max_prompt_length=%d tokens (first: %s).%s",
                           truncation, len(cut), len(keep), max_prompt_length, cut[0], lost)

    # ------------------------------------------------------------------ building
    def _load(self, require_ground_truth: bool):
        rows, sources, messages = [], [], []
        for path in self.files:
            for i, row in enumerate(read_rows(path)):
                where = RowSource(path, i)
                if self.prompt_key not in row or row[self.prompt_key] is None:
                    raise DataError(f"{where} has no prompt key {self.prompt_key!r} (data.prompt_key); "
                                     f"its keys are {sorted(row)}")
                messages.append(_to_messages(row[self.prompt_key], where, self.prompt_key))
                if images_of(row, self.image_key) or self.vision is not None:
                    problem = row_image_problem(row, self.prompt_key, self.image_key, os.path.dirname(path))
                    if problem:
                        raise ValueError(f"{where}: {problem}")
                if require_ground_truth and _is_missing(ground_truth_of(row)):
                    raise DataError(f"{where} has no ground truth (reward_model.ground_truth); keys: {sorted(row)}")
                rows.append(row)
                sources.append(where)
        if not rows:
            raise DataError(f"no rows in {self.files}")
        return rows, sources, messages

    def _with_images(self, text: str, row: dict[str, Any], where: RowSource) -> str:
        """The rendered prompt with each ``<image>`` expanded to its vision block (sizes from the headers)."""
        refs = images_of(row, self.image_key)
        if not refs:
            return text
        if self.vision is None:
            raise ValueError(f"{where} has images ({self.image_key!r}) but the model reads text only; use a "
                             "vision-language model (Qwen2-VL / Qwen2.5-VL / Qwen3-VL) or a text data set")
        base_dir = os.path.dirname(where.path)
        counts = [self.vision.spec.num_tokens(open_image(ref, base_dir), ref) for ref in refs]
        return expand_image_tags(text, counts)

    def render(self, messages: list[dict[str, str]]) -> str:
        """The prompt text the model sees."""
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                      **self.chat_kwargs)
            if not isinstance(text, str):  # transformers 5 may hand back a list or an encoding
                raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str")
            return text
        return "\n".join(m["content"] for m in messages)

    def _tokenize(self, texts: list[str]) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for start in range(0, len(texts), _TOKENIZE_CHUNK):
            encoded = self.tokenizer(texts[start : start + _TOKENIZE_CHUNK], add_special_tokens=False)
            out += [np.asarray(ids, dtype=np.int64) for ids in encoded["input_ids"]]
        return out

    def _truncate(self, ids: np.ndarray, where: RowSource) -> np.ndarray:
        limit = self.max_prompt_length
        if len(ids) <= limit:
            return ids
        if self.truncation == "left":
            return ids[-limit:]
        if self.truncation == "right":
            return ids[:limit]
        if self.truncation == "middle":
            left = limit // 2
            return np.concatenate([ids[:left], ids[len(ids) - (limit - left):]])
        raise DataError(f"{where}: prompt is {len(ids)} tokens, longer than data.max_prompt_length={limit}; "
                         "raise max_prompt_length, set data.truncation=left|right|middle, or "
                         "data.filter_overlong_prompts=True")

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.rows[i]
        extra_info = row.get("extra_info")
        extra_info = dict(extra_info) if isinstance(extra_info, dict) else {}
        item = {
            "input_ids": self.token_ids[i],
            "data_source": row.get("data_source", "unknown"),
            "ground_truth": ground_truth_of(row),
            "extra_info": extra_info,
            "index": extra_info.get("index", self.sources[i].row),
        }
        if self.reward_fn_key != "data_source":
            item[self.reward_fn_key] = row.get(self.reward_fn_key)
        if "agent_name" in row:  # the agent loop this row runs (rollout.mode=async / multi_turn.enable)
            item["agent_name"] = row.get("agent_name")
        if self.return_raw_chat:
            item["raw_prompt"] = self.messages[i]
        if self.return_full_prompt:
            item["full_prompts"] = self.texts[i]
        if self.vision is not None:
            item["multi_modal_inputs"] = self.image_inputs(i)
        return item

    def image_inputs(self, i: int) -> dict[str, Any]:
        """Row ``i``'s images decoded and encoded by the model's image processor (empty for a text row)."""
        refs = images_of(self.rows[i], self.image_key)
        if not refs:
            return {}
        base_dir = os.path.dirname(self.sources[i].path)
        images = [self.vision.spec.load(ref, base_dir) for ref in refs]
        return self.vision.spec.encode(images, self.vision.image_processor)

    def source_of(self, i: int) -> RowSource:
        return self.sources[i]


def object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array holding each value as is (np.array would turn lists of lists into a 2-D array)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out
