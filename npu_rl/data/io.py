"""Reading and writing rows of the verl prompt schema: parquet and JSONL, with errors that name the file and row.

A row is a plain dict: ``data_source``, ``prompt`` (a list of ``{role, content}`` messages), ``ability``,
``reward_model`` (``{style, ground_truth}``) and ``extra_info`` (``{split, index, ...}``). Parquet is read with
pyarrow's ``to_pylist`` so nested columns come back as lists and dicts (pandas would give NumPy arrays).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Iterable

from npu_rl.utils.paths import apply_umask

PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
COMPRESSED_SUFFIXES = (".xz", ".gz")  # read transparently by read_jsonl (the packaged data sets are .jsonl.xz)


def expand_path(path: str) -> str:
    return os.path.abspath(os.path.expanduser(os.path.expandvars(str(path))))


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file; blank lines are skipped. A ``.json`` file holding one list is accepted too.
    ``.xz`` / ``.gz`` files are decompressed on the fly (``train.jsonl.xz``)."""
    rows: list[dict[str, Any]] = []
    data = _read_bytes(path)
    if path.endswith(COMPRESSED_SUFFIXES):
        path_for_format = path.rsplit(".", 1)[0]
    else:
        path_for_format = path
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ValueError(f"{path}: not UTF-8 text (line {line}, byte {exc.start}): {exc.reason}") from exc
    stripped = text.lstrip()
    if path_for_format.endswith(".json") and stripped.startswith("["):
        try:
            rows = list(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc
    else:
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {lineno} is not valid JSON: {exc.msg}") from exc
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: row {i} is a {type(row).__name__}, expected a JSON object")
    return rows


def _read_bytes(path: str) -> bytes:
    if path.endswith(".xz"):
        import lzma

        opener: Any = lzma.open
    elif path.endswith(".gz"):
        import gzip

        opener = gzip.open
    else:
        opener = open
    try:
        with opener(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except Exception as exc:  # lzma.LZMAError, gzip.BadGzipFile (an OSError), EOFError for a truncated file
        raise ValueError(f"{path}: cannot decompress: {type(exc).__name__}: {exc}") from exc


def read_parquet(path: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types (ArrowInvalid, OSError ...)
        raise ValueError(f"{path}: cannot read as parquet: {type(exc).__name__}: {exc}") from exc
    return table.to_pylist()


def read_rows(path: str) -> list[dict[str, Any]]:
    """Rows of one parquet or JSONL file; the format follows the suffix."""
    path = expand_path(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"data file {path} does not exist")
    if os.path.isdir(path):
        if is_hf_dataset_dir(path):
            return read_hf_dataset_dir(path)
        if os.path.isfile(os.path.join(path, "dataset_dict.json")):
            with open(os.path.join(path, "dataset_dict.json"), encoding="utf-8") as f:
                splits = json.load(f).get("splits", [])
            raise ValueError(f"data folder {path} is a Hugging Face DatasetDict with splits {splits}; give one split's "
                             f"folder, e.g. {os.path.join(path, splits[0] if splits else 'train')}")
        raise ValueError(f"data file {path} is a folder; give the parquet/jsonl file inside it, or a folder written "
                         "by datasets' save_to_disk")
    lower = path.lower()
    if lower.endswith(COMPRESSED_SUFFIXES):
        lower = lower.rsplit(".", 1)[0]
    if lower.endswith(PARQUET_SUFFIXES) and lower == path.lower():
        return read_parquet(path)
    if lower.endswith(JSONL_SUFFIXES):
        return read_jsonl(path)
    raise ValueError(f"data file {path}: unknown format; expected one of {PARQUET_SUFFIXES + JSONL_SUFFIXES} "
                     f"(JSON lines may be compressed: {', '.join(COMPRESSED_SUFFIXES)})")


def is_hf_dataset_dir(path: str) -> bool:
    """A folder written by ``datasets.Dataset.save_to_disk`` (state.json + dataset_info.json + *.arrow)."""
    return os.path.isfile(os.path.join(path, "state.json")) and os.path.isfile(os.path.join(path, "dataset_info.json"))


def read_hf_dataset_dir(path: str) -> list[dict[str, Any]]:
    """Rows of a ``save_to_disk`` folder (``datasets.load_from_disk``; reads Arrow files, executes nothing)."""
    try:
        from datasets import load_from_disk
    except ImportError as exc:
        raise ValueError(f"{path} is a Hugging Face datasets folder: pip install datasets to read it") from exc
    try:
        data = load_from_disk(path)
    except Exception as exc:  # datasets raises FileNotFoundError, ArrowInvalid, ... for damaged folders
        raise ValueError(f"{path}: cannot load as a datasets folder: {type(exc).__name__}: {exc}") from exc
    if not hasattr(data, "to_list"):
        raise ValueError(f"{path}: holds several splits ({list(data)}); give one split's folder")
    return data.to_list()


def write_parquet(rows: Iterable[dict[str, Any]], path: str) -> str:
    """Write rows atomically (a temporary file, then rename), so concurrent readers never see half a file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = expand_path(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    table = pa.Table.from_pylist(list(rows))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".parquet", dir=os.path.dirname(path))
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        apply_umask(tmp)  # mkstemp made it 0600; the file gets the modes of any other file the user writes
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path
