"""Is a model folder's content what its files claim? A ``.safetensors`` file whose size agrees with its header, and
``.json`` files (config, tokenizer, generation config, shard index) that parse. Reads headers and small files only,
never the weights.

Used on a local folder at validation (``npu_rl.models.check``) and on a snapshot just downloaded from the Hub or
ModelScope (``npu_rl.models.hub``, ``npu_rl.models.modelscope_hub``), so a truncated download, or a mirror that
served an error page under a file's name, is named (file and reason) instead of failing later inside transformers.
"""

from __future__ import annotations

import glob
import json
import os
import struct

from npu_rl.utils.safe_load import CorruptFileError

JSON_LIMIT_BYTES = 64 << 20  # a tokenizer.json of a 256k vocabulary is ~20 MB; larger files are not parsed here


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
    if not isinstance(header, dict):
        return f"{path} is not a safetensors file: its header is a JSON {type(header).__name__}, not an object"
    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"
            and isinstance(entry, dict) and "data_offsets" in entry]
    expected = 8 + header_len + max(ends, default=0)
    if size < expected:
        return f"{path} is truncated: {size} bytes, its header describes {expected} (an interrupted download or copy?)"
    return None


def json_problem(path: str) -> str | None:
    """Why a ``.json`` file does not parse (None: it does, or it is too large to check here)."""
    try:
        if os.path.getsize(path) > JSON_LIMIT_BYTES:
            return None
        with open(path, encoding="utf-8") as f:
            json.load(f)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        return f"{path} is not valid JSON ({type(exc).__name__}: {exc}; a truncated download or copy?)"
    return None


def folder_file_problems(folder: str) -> list[str]:
    """Every ``*.json`` and ``*.safetensors`` file directly in ``folder`` that is not whole, named."""
    problems = [json_problem(p) for p in sorted(glob.glob(os.path.join(folder, "*.json")))]
    problems += [safetensors_problem(p) for p in sorted(glob.glob(os.path.join(folder, "*.safetensors")))]
    return [p for p in problems if p]


def check_downloaded(folder: str, what: str, source: str, remove: str) -> str:
    """``folder`` when its files are whole, else a CorruptFileError naming each bad file, ``what`` (the id) and
    ``source`` (the endpoint, credentials masked), and how to fetch it anew (``remove``: how to drop it from the
    cache; nothing is deleted here)."""
    problems = folder_file_problems(folder)
    if problems:
        raise CorruptFileError(f"{what}: the snapshot downloaded from {source} is not whole: {'; '.join(problems)}. "
                               f"To download it anew, drop it from the cache ({remove}) and run again; if the "
                               "server sends the same bytes, the fault is there")
    return folder
