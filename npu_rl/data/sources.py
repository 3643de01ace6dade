"""Where prompt data comes from: each entry of ``data.train_files`` / ``data.val_files`` -> local files that
``npu_rl.data.io.read_rows`` reads. Resolved, and so checked, at validation, before any model loads.

    ~/data/gsm8k/train.parquet                 a parquet or JSON-lines file (``.jsonl``, ``.json``, ``.jsonl.xz`` ...)
    ~/data/gsm8k/train-*.parquet               a glob (as verl's ``datasets.load_dataset("parquet", ...)`` takes)
    ~/data/gsm8k_ds/train                      a folder written by ``Dataset.save_to_disk``
    ~/data/gsm8k_ds  or  ~/data/gsm8k_ds?split=test   a ``DatasetDict.save_to_disk`` root: the split named, else
                                               ``train`` for train_files and ``validation`` / ``test`` for val_files
    builtin://arith/train                      the sets made in-process (``npu_rl.data.builtin``)
    hf://datasets/<owner>/<name>[@<rev>]/<path-in-repo>   a file (or glob) of a Hub data set repo, as
                                               huggingface_hub's HfFileSystem names it: downloaded into the Hub cache
    hf://datasets/<owner>/<name>[/<config>]?split=train[&revision=<rev>]   a Hub data set through ``datasets``
                                               (``load_dataset``), cached as parquet under ``$NPU_RL_CACHE/hub``
    modelscope://<owner>/<name>[@<rev>]/<path-in-repo>, modelscope://<owner>/<name>[/<subset>]?split=train
                                               a ModelScope data set's file(s) or split
                                               (``npu_rl.data.modelscope_sets``; plain ``owner/name/...`` too under
                                               ``VERL_USE_MODELSCOPE``)

Offline (``HF_HUB_OFFLINE=1``) the Hub forms read only the caches: the Hub cache for files, ``datasets``' own cache
(``HF_DATASETS_CACHE``) and ours for data sets. Other schemes (``hdfs://``, ``s3://`` ...) are refused with the
reason. A Hub model id where a data file belongs, or a bare ``owner/name``, gets the ``hf://datasets/`` and
``modelscope://`` spellings.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import json
import os
import re
from typing import Optional
from urllib.parse import urlsplit

from npu_rl.data.builtin import cache_dir, is_builtin, resolve_builtin
from npu_rl.data.io import DATA_SUFFIXES, GLOB as _GLOB, expand_path, is_hf_dataset_dir, split_query as _split_query, \
    write_parquet
from npu_rl.utils.hf_env import describe_error, hub_cache_dir, hub_call, hub_endpoint, hub_timeout_s, is_offline, \
    shown_endpoint
from npu_rl.data.builtin import check_builtin
from npu_rl.data.io import read_rows
from npu_rl.data.preprocess import CONVERTERS
from npu_rl.data.images import images_of, row_image_problem
from npu_rl.data.modelscope_sets import PREFIX as MODELSCOPE_PREFIX, parse_modelscope_data, resolve_modelscope_data

HUB_SCHEME = "hf://"
HUB_DATASETS = "hf://datasets/"
VAL_SPLITS = ("validation", "test", "val", "valid")


def resolve_data_path(item: str, default_split: Optional[str] = None) -> list[str]:
    """One entry of ``data.*_files`` -> its local files (several for a glob). Raises naming the entry."""
    if not isinstance(item, str):
        raise TypeError(f"data file {item!r} is a {type(item).__name__}, expected a path string")
    if is_builtin(item):
        return [resolve_builtin(item)]
    if item.startswith(HUB_SCHEME):
        return _resolve_hub(item)
    if item.startswith(MODELSCOPE_PREFIX):
        return resolve_modelscope_data(parse_modelscope_data(item))
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", item)
    if scheme:
        raise ValueError(f"{item!r}: {scheme.group(1)}:// data paths are not read here (verl copies hdfs:// with its "
                         "hdfs_io); copy the files to a local folder and give that path, or use hf://datasets/... or "
                         "modelscope://...")
    full = expand_path(item)
    if os.path.exists(full):
        return [_local(full, item, None, default_split)]
    path, query = _split_query(item)
    ms_data = parse_modelscope_data(item)  # a plain id under VERL_USE_MODELSCOPE, when nothing local has its name
    if ms_data is not None and not os.path.exists(expand_path(path)) and not glob.glob(full):
        return resolve_modelscope_data(ms_data)
    if query:
        unknown = set(query) - {"split"}
        if unknown:
            raise ValueError(f"{item!r}: a local data path takes only ?split=<name>, not {sorted(unknown)}")
        return [_local(expand_path(path), item, query.get("split"), default_split)]
    if _GLOB.search(item):
        matches = sorted(glob.glob(full))
        if not matches:
            raise FileNotFoundError(f"data files {item!r}: the pattern matches no file")
        return [_local(m, item, None, default_split) for m in matches]
    hint = ""
    if re.fullmatch(r"[\w.-]+/[\w.-]+", item) and not item.lower().endswith(DATA_SUFFIXES):
        hint = (f"; for the Hugging Face Hub data set {item}, write hf://datasets/{item}?split=train (through "
                f"datasets) or hf://datasets/{item}/<file>.parquet; for the ModelScope one, "
                f"modelscope://{item}?split=train or modelscope://{item}/<file>.parquet")
    raise FileNotFoundError(f"data file {item!r} does not exist" + (f" (resolved to {full})" if full != item else "")
                            + (hint or _preprocess_hint(item, full)))


def _preprocess_hint(item: str, full: str) -> str:
    """The command that writes the missing file where the key looks (verl's default is ~/data/rlhf/gsm8k, its
    preprocess scripts' ~/data/gsm8k: name the folder, so the two never disagree)."""
    names = sorted(CONVERTERS)
    name = next((n for n in names if n in item.lower()), None)
    if name is None or os.path.basename(full) not in ("train.parquet", "test.parquet"):
        return (" (point the key at a parquet/jsonl file; `npu-rl preprocess " + "|".join(names)
                + " --output-dir DIR` writes DIR/train.parquet and DIR/test.parquet)")
    return f" (run `npu-rl preprocess {name} --output-dir {os.path.dirname(item)}`, or point the key at a parquet/jsonl file)"


def _local(full: str, item: str, split: Optional[str], default_split: Optional[str]) -> str:
    if not os.path.exists(full):
        raise FileNotFoundError(f"data file {item!r} does not exist (resolved to {full})")
    if os.path.isfile(full):
        if split:
            raise ValueError(f"{item!r}: ?split= names a split of a DatasetDict folder; {full} is a file")
        return full
    if is_hf_dataset_dir(full):
        if split:
            raise ValueError(f"{item!r}: {full} is a single split written by save_to_disk; drop ?split=")
        return full
    dict_file = os.path.join(full, "dataset_dict.json")
    if os.path.isfile(dict_file):
        with open(dict_file, encoding="utf-8") as f:
            splits = list(json.load(f).get("splits", []))
        choice = split or _default_split(splits, default_split)
        if choice not in splits:
            wanted = f"split {split!r}" if split else f"a {default_split!r} split"
            raise ValueError(f"{item!r}: the DatasetDict folder {full} has splits {splits}, not {wanted}; name one: "
                             f"{item.split('?')[0]}?split={splits[0] if splits else 'train'}")
        return os.path.join(full, choice)
    raise ValueError(f"{item!r} is a folder ({full}) but not one written by datasets' save_to_disk (no "
                     "state.json + dataset_info.json, nor dataset_dict.json); give the parquet/jsonl file inside it "
                     f"or a glob ({os.path.join(item, '*.parquet')})")


def _default_split(splits: list[str], default_split: Optional[str]) -> Optional[str]:
    if default_split in (None, "train"):
        return default_split
    return next((s for s in VAL_SPLITS if s in splits), default_split)


# --------------------------------------------------------------------------------------------- the Hugging Face Hub
def _resolve_hub(item: str) -> list[str]:
    if not item.startswith(HUB_DATASETS):
        raise ValueError(f"{item!r}: only data set repos are read as data (hf://datasets/<owner>/<name>/...)")
    path, query = _split_query(item)
    names = [p for p in urlsplit(path).path.split("/") if p]  # after "hf://datasets"
    if len(names) < 2:
        raise ValueError(f"{item!r}: expected hf://datasets/<owner>/<name>/<file> or "
                         "hf://datasets/<owner>/<name>[/<config>]?split=<split>")
    repo, _, revision = "/".join(names[:2]).partition("@")
    rest = "/".join(names[2:])
    if rest and (rest.lower().endswith(DATA_SUFFIXES) or _GLOB.search(rest)):
        if query:
            raise ValueError(f"{item!r}: a file path in a Hub repo takes no ?split= (the file is the split)")
        return _hub_files(repo, revision or None, rest, item)
    if "split" not in query:
        raise ValueError(f"{item!r}: name a split (hf://datasets/{repo}{'/' + rest if rest else ''}?split=train) or "
                         f"a file in the repo (hf://datasets/{repo}/<path>.parquet)")
    if len(names) > 3:
        raise ValueError(f"{item!r}: expected hf://datasets/<owner>/<name>[/<config>]?split=<split>; "
                         f"{rest!r} is neither a config name nor a parquet/jsonl file")
    return [_hub_dataset(repo, rest or None, query["split"], query.get("revision") or revision or None, item)]


def _hub_files(repo: str, revision: Optional[str], pattern: str, item: str) -> list[str]:
    """Files of a Hub data set repo (a glob matches the repo's listing, or the cached snapshot offline). Each request
    about the repo (the listing, a file's metadata) is bounded by ``hub_call``; the bytes of a file then come with a
    timeout on each read."""
    from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url, snapshot_download

    cache = hub_cache_dir()
    endpoint = hub_endpoint()
    try:
        if is_offline():
            folder = snapshot_download(repo, repo_type="dataset", revision=revision, cache_dir=cache,
                                       local_files_only=True, allow_patterns=[pattern])
            files = sorted(glob.glob(os.path.join(folder, pattern)))
            if not files:
                raise FileNotFoundError(pattern)
            return files
        if _GLOB.search(pattern):
            listing = hub_call(lambda: HfApi(endpoint=endpoint).list_repo_files(repo, repo_type="dataset",
                                                                                revision=revision),
                               f"{item!r}: listing the files of the data set repo {repo}", endpoint)
            names = sorted(n for n in listing if fnmatch.fnmatch(n, pattern))
            if not names:
                raise ValueError(f"{item!r}: the pattern matches no file of the data set repo {repo} "
                                 f"(it has {len(listing)} files)")
        else:
            names = [pattern]
        files = []
        for name in names:
            url = hf_hub_url(repo, name, repo_type="dataset", revision=revision, endpoint=endpoint)
            hub_call(lambda: get_hf_file_metadata(url, timeout=hub_timeout_s(), retry_on_errors=False),
                     f"{item!r}: the file {name} of the data set repo {repo}", endpoint)
            files.append(hf_hub_download(repo, name, repo_type="dataset", revision=revision, cache_dir=cache,
                                         endpoint=endpoint, etag_timeout=hub_timeout_s()))
        return files
    except (ValueError, TimeoutError):
        raise
    except Exception as exc:  # not cached offline; repo / file missing; no connection
        where = f"the Hub cache ({cache}, HF_HUB_OFFLINE is set)" if is_offline() else shown_endpoint(endpoint)
        raise FileNotFoundError(f"{item!r}: cannot get it from {where}: {describe_error(exc)}") from exc


def _hub_dataset(repo: str, config: Optional[str], split: str, revision: Optional[str], item: str) -> str:
    """A Hub data set through ``datasets.load_dataset``, kept as one parquet file under ``$NPU_RL_CACHE/hub``.
    Offline, ``datasets`` reads its own cache (``HF_DATASETS_CACHE``) when the set was loaded there before."""
    key = {"repo": repo, "config": config, "split": split, "revision": revision}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    path = os.path.join(cache_dir(), "hub", f"{repo.replace('/', '--')}-{digest}", f"{split}.parquet")
    if os.path.isfile(path):
        return path
    try:
        from datasets import load_dataset
    except ImportError as exc:
        raise ValueError(f"{item!r}: reading a Hub data set needs pip install datasets") from exc
    try:  # each read times out after NPU_RL_HUB_TIMEOUT_S, the whole load after NPU_RL_HUB_LOAD_TIMEOUT_S
        data = hub_call(lambda: load_dataset(repo, config, split=split, revision=revision),
                        f"{item!r}: datasets.load_dataset({repo!r}, {config!r}, split={split!r})", overall=True)
    except TimeoutError:
        raise
    except Exception as exc:  # DatasetNotFoundError, ConnectionError, ValueError (unknown split) ...
        offline = (" HF_HUB_OFFLINE is set and datasets' cache has no copy of it: load it once online, or save it "
                   "with save_to_disk and give that folder.") if is_offline() else ""
        raise FileNotFoundError(f"{item!r}: datasets.load_dataset({repo!r}, {config!r}, split={split!r}) failed "
                                f"({shown_endpoint()}): {describe_error(exc)}.{offline}") from exc
    write_parquet(data.to_list(), path)
    return path


# ------------------------------------------------------------------------------------------------------- the lists
def resolve_data_files(files: object, default_split: Optional[str] = None) -> list[str]:
    """``data.train_files`` / ``val_files`` (a path or a list of them) -> absolute local paths.

    ``default_split`` picks a DatasetDict root's split when the path names none (``train`` for train_files,
    ``validation`` for val_files: then ``test`` and ``val`` are tried too)."""
    if files is None:
        raise ValueError("no data files given (data.train_files / data.val_files is empty)")
    if isinstance(files, str):
        items = [files]
    else:
        try:
            items = list(files)  # lists, tuples and OmegaConf ListConfig
        except TypeError as exc:
            raise TypeError(f"data files must be a path or a list of paths, got {type(files).__name__}") from exc
    if not items:
        raise ValueError("no data files given (data.train_files / data.val_files is an empty list)")
    paths: list[str] = []
    for item in items:
        paths += resolve_data_path(item, default_split)
    return paths


def data_files_problems(key: str, files: object) -> list[str]:
    """Validation of ``data.<key>``: every entry resolves (downloads from the Hub happen here, once, when online)."""
    default_split = "train" if key == "train_files" else "validation"
    try:
        items = [files] if isinstance(files, str) else list(files or [])
    except TypeError:
        return [f"data.{key} must be a path or a list of paths, got {type(files).__name__}"]
    if not items:
        return [f"data.{key} is empty"]
    problems = []
    for item in items:
        try:
            resolve_data_path(item, default_split) if not is_builtin(item) else _check_builtin(item)
        except (OSError, ValueError, TypeError, ImportError) as exc:  # ImportError: modelscope not installed
            problems.append(f"data.{key}: {exc}")
    return problems


def _check_builtin(item: str) -> None:
    check_builtin(item)  # generating a built-in set is the run's job, not validation's


UNREAD_MEDIA_COLUMNS = ("videos", "audios")  # verl's data.video_key / audio_key defaults: not read here
MAX_LISTED_ROWS = 3


def multimodal_problems(key: str, paths: list[str], image_key: str = "images",
                        prompt_key: str = "prompt") -> list[str]:
    """Rows that carry videos or audio (refused: not read here, they would be dropped without a word), and rows
    whose images are bad: an entry that cannot be opened (corrupt bytes, a missing file, a header over the decode
    bound) or a number of ``<image>`` tags other than the number of images (``npu_rl.data.images``). Only headers
    are read."""
    problems = []
    for path in paths:
        try:
            rows = read_rows(path)
        except (OSError, ValueError):
            continue  # unreadable: the data loader says why
        for column in UNREAD_MEDIA_COLUMNS:
            hit = next((i for i, row in enumerate(rows) if row.get(column)), None)
            if hit is not None:
                problems.append(f"data.{key}: {path}: row {hit} has {column!r}; npu-rl reads text and images only "
                                f"(data.image_key) and would drop the {column}. Use a data set without {column}")
        bad = []
        for i, row in enumerate(rows):
            if images_of(row, image_key):
                problem = row_image_problem(row, prompt_key, image_key, os.path.dirname(path))
                if problem:
                    bad.append(f"data.{key}: {path}: row {i}: {problem}")
        problems += bad[:MAX_LISTED_ROWS]
        if len(bad) > MAX_LISTED_ROWS:
            problems.append(f"data.{key}: {path}: {len(bad) - MAX_LISTED_ROWS} more rows with bad images")
    return problems


def has_image_rows(paths: list[str], image_key: str = "images") -> bool:
    for path in paths:
        try:
            if any(images_of(row, image_key) for row in read_rows(path)):
                return True
        except (OSError, ValueError):
            continue
    return False
