"""Is a model folder whole? Checked at validation, before the data loads and long before ``from_pretrained`` would
fail with a library traceback (or, for a folder without tokenizer files, succeed and tokenize every prompt to nothing).

``model_folder_problems(folder)`` reads only file names and safetensors headers (a few KB), never the weights.
"""

from __future__ import annotations

import glob
import json
import os
import struct

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "tokenizer.tiktoken",
                   "qwen.tiktoken")


def safetensors_problem(path: str) -> str | None:
    """Why a ``.safetensors`` file is not whole (None: its header and size agree)."""
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path} is truncated ({size} bytes, not even a header)"
            (header_len,) = struct.unpack("<Q", head)
            if header_len > size - 8:
                return f"{path} is truncated: its header says {header_len} bytes of header, the file has {size - 8}"
            header = json.loads(f.read(header_len))
    except (OSError, ValueError) as exc:
        return f"{path} is not a readable safetensors file ({type(exc).__name__}: {exc})"
    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"
            and isinstance(entry, dict) and "data_offsets" in entry]
    expected = 8 + header_len + max(ends, default=0)
    if size < expected:
        return f"{path} is truncated: {size} bytes, its header describes {expected} (an interrupted download or copy?)"
    return None


def model_folder_problems(folder: str, need_tokenizer: bool = True) -> list[str]:
    """Missing tokenizer files, missing or truncated weights; each message names the folder or file."""
    problems = []
    names = set(os.listdir(folder))
    if need_tokenizer and not any(n in names for n in TOKENIZER_FILES):
        problems.append(f"{folder} has no tokenizer files (one of {', '.join(TOKENIZER_FILES[:4])} ...): every prompt "
                        "would tokenize to nothing. Copy the tokenizer files of the base model into it")
    safetensors = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    bins = sorted(glob.glob(os.path.join(folder, "pytorch_model*.bin")))
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = os.path.join(folder, index_name)
        if os.path.isfile(index):
            try:
                with open(index, encoding="utf-8") as f:
                    shards = sorted(set(json.load(f)["weight_map"].values()))
            except (OSError, ValueError, KeyError) as exc:
                problems.append(f"{index} is unreadable ({type(exc).__name__}: {exc})")
                continue
            problems += [f"{index} names {s}, which is missing" for s in shards
                         if not os.path.isfile(os.path.join(folder, s))]
    if not safetensors and not bins:
        problems.append(f"{folder} has config.json but no weights (*.safetensors or pytorch_model*.bin)")
    for path in safetensors:
        problem = safetensors_problem(path)
        if problem:
            problems.append(problem)
    return problems
