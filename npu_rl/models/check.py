"""Is a model folder whole? Checked at validation, before the data loads and long before ``from_pretrained`` would
fail with a library traceback (or, for a folder without tokenizer files, succeed and tokenize every prompt to nothing).

``model_folder_problems(folder)`` reads only file names and safetensors headers (a few KB), never the weights.
``model_path_problems(path)`` adds what comes before: the path exists, is a folder, is not empty, has a
``config.json`` that is a JSON object. Every command that takes a model folder (``train``'s validation,
``doctor --parity``, ``eval``, ``merge``) asks ``check_model_folder``, so they all say the same words.
"""

from __future__ import annotations

import glob
import json
import os
import struct

from npu_rl.models.loader import is_builtin

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


class ModelFolderError(ValueError):
    """A model folder that cannot be loaded; the message lists every problem, naming the key and the file."""


def config_json_problem(folder: str) -> str | None:
    path = os.path.join(folder, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        return f"{path} is not valid JSON ({type(exc).__name__}: {exc})"
    if not isinstance(config, dict):
        return f"{path} holds a JSON {type(config).__name__}, not an object"
    if "model_type" not in config and not config.get("architectures"):
        return f"{path} has neither model_type nor architectures: not a Hugging Face model config"
    return None


def model_path_problems(path: str, need_tokenizer: bool = True) -> list[str]:
    """Everything wrong with the model folder ``path`` (a built-in model name: nothing; it is converted on use)."""
    if is_builtin(str(path)):
        return []
    folder = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.exists(folder):
        return [f"{folder} does not exist"]
    if not os.path.isdir(folder):
        return [f"{folder} is a file, not a model folder (give the folder that holds config.json)"]
    if not os.listdir(folder):
        return [f"{folder} is empty: not a Hugging Face model folder (config.json, weights, tokenizer files)"]
    if not os.path.isfile(os.path.join(folder, "config.json")):
        return [f"{folder} has no config.json: not a Hugging Face model folder"]
    problem = config_json_problem(folder)
    return ([problem] if problem else []) + model_folder_problems(folder, need_tokenizer)


def check_model_folder(path: str, key: str, need_tokenizer: bool = True) -> None:
    """Raise ``ModelFolderError`` listing what is wrong with ``path`` (given as ``key``), or return."""
    problems = model_path_problems(path, need_tokenizer)
    if problems:
        raise ModelFolderError("; ".join(f"{key}: {p}" for p in problems))
