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

PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


def expand_path(path: str) -> str:
    return os.path.abspath(os.path.expanduser(os.path.expandvars(str(path))))


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file; blank lines are skipped. A ``.json`` file holding one list is accepted too."""
    rows: list[dict[str, Any]] = []
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ValueError(f"{path}: not UTF-8 text (line {line}, byte {exc.start}): {exc.reason}") from exc
    stripped = text.lstrip()
    if path.endswith(".json") and stripped.startswith("["):
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
        raise ValueError(f"data file {path} is a folder; give the parquet/jsonl file inside it")
    lower = path.lower()
    if lower.endswith(PARQUET_SUFFIXES):
        return read_parquet(path)
    if lower.endswith(JSONL_SUFFIXES):
        return read_jsonl(path)
    raise ValueError(f"data file {path}: unknown format; expected one of {PARQUET_SUFFIXES + JSONL_SUFFIXES}")


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
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path
