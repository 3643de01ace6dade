"""Reading and writing rows of the verl prompt schema: parquet and JSONL, with errors that name the file and row.

A row is a plain dict: ``data_source``, ``prompt`` (a list of ``{role, content}`` messages), ``ability``,
``reward_model`` (``{style, ground_truth}``) and ``extra_info`` (``{split, index, ...}``). Parquet is read with
pyarrow's ``to_pylist`` so nested columns come back as lists and dicts (pandas would give NumPy arrays).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from typing import Any, Iterable
from urllib.parse import parse_qsl

from npu_rl.utils.paths import apply_umask


class DataError(ValueError):
    """A data file or rows that cannot be read or written as asked: the message names the file (or data set), and
    the column and row where they can be known. ``npu-rl train`` says it in one line (exit code 2)."""


PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
COMPRESSED_SUFFIXES = (".xz", ".gz")  # read transparently by read_jsonl (the packaged data sets are .jsonl.xz)
DATA_SUFFIXES = PARQUET_SUFFIXES + JSONL_SUFFIXES + tuple(s + c for s in JSONL_SUFFIXES for c in COMPRESSED_SUFFIXES)
GLOB = re.compile(r"[*?\[]")


def split_query(item: str) -> tuple[str, dict[str, str]]:
    """``path?split=x&revision=y`` -> (path, {split, revision}); a ``?`` that starts no such query stays (a glob)."""
    head, sep, query = item.partition("?")
    if sep and re.fullmatch(r"(split|revision)=[^&]*(&(split|revision)=[^&]*)*", query):
        return head, dict(parse_qsl(query, keep_blank_values=True))
    return item, {}


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
        raise DataError(f"{path}: not UTF-8 text (line {line}, byte {exc.start}): {exc.reason}") from exc
    stripped = text.lstrip()
    if path_for_format.endswith(".json") and stripped.startswith("["):
        try:
            rows = list(json.loads(text))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc
    else:
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}: line {lineno} is not valid JSON: {exc.msg}") from exc
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{path}: row {i} is a {type(row).__name__}, expected a JSON object")
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
        raise DataError(f"{path}: cannot decompress: {type(exc).__name__}: {exc}") from exc


def read_parquet(path: str) -> list[dict[str, Any]]:
    """Rows of a parquet file; a file pyarrow cannot read, or a value it cannot give as Python, is a DataError
    naming the file and, where the file's own structure says, the column (and row group, or row)."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types (ArrowInvalid, OSError ...)
        raise DataError(f"{path}: cannot read as parquet: {_parquet_part(path)}{type(exc).__name__}: {exc}") from exc
    try:
        return table.to_pylist()
    except Exception as exc:  # a value with no Python equivalent (a date past year 9999, ...)
        raise DataError(f"{path}: {_bad_cell(table)}cannot be read as a Python value: {type(exc).__name__}: "
                        f"{exc}") from exc


def parquet_problem(path: str) -> str | None:
    """What makes ``path`` unreadable as parquet, from its footer alone (no data is read), or None. For validation:
    a truncated file, or one that is not parquet, is named before anything loads."""
    import pyarrow.parquet as pq

    try:
        pq.ParquetFile(path).schema_arrow
    except Exception as exc:  # noqa: BLE001 - the reason is shown
        return f"{path}: cannot read as parquet: {type(exc).__name__}: {exc}"
    return None


def _parquet_part(path: str) -> str:
    """'column 'x' (row group g, rows a-b): ' for the first column chunk that fails to read on its own, else ''."""
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        names, metadata = parquet.schema_arrow.names, parquet.metadata
    except Exception:  # noqa: BLE001 - the footer itself is bad: the file is all there is to name
        return ""
    first = 0
    for group in range(metadata.num_row_groups):
        rows = metadata.row_group(group).num_rows
        for name in names:
            try:
                parquet.read_row_group(group, columns=[name]).to_pylist()
            except Exception:  # noqa: BLE001 - found the part; the caller gives the error itself
                return f"column {name!r} (row group {group}, rows {first}-{first + rows - 1}): "
        first += rows
    return ""


def _bad_cell(table) -> str:
    """'column 'x', row i: ' for the first value pyarrow cannot give as Python, else ''."""
    for name in table.column_names:
        column = table.column(name)
        try:
            column.to_pylist()
            continue
        except Exception:  # noqa: BLE001 - look for the row
            pass
        for row in range(len(column)):
            try:
                column[row].as_py()
            except Exception:  # noqa: BLE001 - found it
                return f"column {name!r}, row {row}: "
        return f"column {name!r}: "
    return ""


def mixed_type_problem(rows: list[dict[str, Any]]) -> str | None:
    """The first column (dotted into dicts: ``reward_model.ground_truth``) whose rows hold values of types one
    parquet column cannot hold together, as 'column 'c', row i: ...', or None."""
    import pyarrow as pa

    def first_bad(values: list[Any], name: str) -> str | None:
        try:
            pa.array(values)
            return None
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
        dicts = [v for v in values if v is not None]
        if dicts and all(isinstance(v, dict) for v in dicts):  # a struct column: the key inside it that disagrees
            for key in dict.fromkeys(k for v in dicts for k in v):
                found = first_bad([None if v is None else v.get(key) for v in values], f"{name}.{key}")
                if found is not None:
                    return found
        low, high = 1, len(values)  # the shortest prefix pyarrow refuses: its last row is the first that disagrees
        while low < high:
            mid = (low + high) // 2
            try:
                pa.array(values[:mid])
                low = mid + 1
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                high = mid
        row = low - 1
        value = values[row]
        earlier = next((i for i in range(row) if values[i] is not None), None)
        if earlier is None:
            return f"column {name!r}, row {row}: {value!r:.60} ({type(value).__name__}) cannot be stored in parquet"
        return (f"column {name!r}, row {row}: {value!r:.60} is a {type(value).__name__}, but row {earlier} holds a "
                f"{type(values[earlier]).__name__} ({values[earlier]!r:.60}); a parquet column holds one type")

    for key in dict.fromkeys(k for row in rows for k in row):
        found = first_bad([row.get(key) for row in rows], key)
        if found is not None:
            return found
    return None


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
            raise DataError(f"data folder {path} is a Hugging Face DatasetDict with splits {splits}; give one split's "
                             f"folder, e.g. {os.path.join(path, splits[0] if splits else 'train')}")
        raise DataError(f"data file {path} is a folder; give the parquet/jsonl file inside it, or a folder written "
                         "by datasets' save_to_disk")
    lower = path.lower()
    if lower.endswith(COMPRESSED_SUFFIXES):
        lower = lower.rsplit(".", 1)[0]
    if lower.endswith(PARQUET_SUFFIXES) and lower == path.lower():
        return read_parquet(path)
    if lower.endswith(JSONL_SUFFIXES):
        return read_jsonl(path)
    raise DataError(f"data file {path}: unknown format; expected one of {PARQUET_SUFFIXES + JSONL_SUFFIXES} "
                     f"(JSON lines may be compressed: {', '.join(COMPRESSED_SUFFIXES)})")


def is_hf_dataset_dir(path: str) -> bool:
    """A folder written by ``datasets.Dataset.save_to_disk`` (state.json + dataset_info.json + *.arrow)."""
    return os.path.isfile(os.path.join(path, "state.json")) and os.path.isfile(os.path.join(path, "dataset_info.json"))


def read_hf_dataset_dir(path: str) -> list[dict[str, Any]]:
    """Rows of a ``save_to_disk`` folder (``datasets.load_from_disk``; reads Arrow files, executes nothing)."""
    try:
        from datasets import load_from_disk
    except ImportError as exc:
        raise DataError(f"{path} is a Hugging Face datasets folder: pip install datasets to read it") from exc
    try:
        data = load_from_disk(path)
    except Exception as exc:  # datasets raises FileNotFoundError, ArrowInvalid, ... for damaged folders
        raise DataError(f"{path}: cannot load as a datasets folder: {type(exc).__name__}: {exc}") from exc
    if not hasattr(data, "to_list"):
        raise DataError(f"{path}: holds several splits ({list(data)}); give one split's folder")
    return data.to_list()


def write_parquet(rows: Iterable[dict[str, Any]], path: str) -> str:
    """Write rows atomically (a temporary file, then rename), so concurrent readers never see half a file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = expand_path(path)
    rows = list(rows)
    try:
        table = pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:  # a column whose rows disagree on a type
        raise DataError(f"cannot write {path}: {mixed_type_problem(rows) or f'{type(exc).__name__}: {exc}'}") from exc
    os.makedirs(os.path.dirname(path), exist_ok=True)
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
