"""ModelScope data sets as entries of ``data.train_files`` / ``data.val_files`` (and the Python API's data arguments):

    modelscope://<owner>/<name>[@<rev>]/<path-in-repo>           a file of the data set repo, or a glob of them
    modelscope://<owner>/<name>[@<rev>][/<subset>]?split=<split>  a split: the repo's data files read by ``datasets``
                                                                  as a local folder, kept as parquet under
                                                                  ``$NPU_RL_CACHE/modelscope``
    <owner>/<name>[@<rev>]/<path-in-repo>, <owner>/<name>[/<subset>]?split=<split>
                                                                  the same while ``VERL_USE_MODELSCOPE`` is true and
                                                                  no local file or folder has that name

Files come through the ``modelscope`` package's data set download (``snapshot_download(repo_type="dataset")``, the
path ``dataset_snapshot_download`` takes) into its cache, ``MODELSCOPE_CACHE/datasets/<owner>--<name>/snapshots/
<rev>``; the environment is read by ``npu_rl.utils.modelscope_env``. As for Hub data sets (``npu_rl.data.sources``):
resolved at validation, downloaded once per node under a file lock, and offline (``HF_HUB_OFFLINE=1``) only the
cache is read, an entry not cached failing with the entry and the cache folder named. A file already in the cache
is used as it is, no server asked (pin a revision with ``@<rev>`` for a fixed copy); a glob asks the server for the
repo's listing when online, so it matches what the repo holds now, and matches the cached files offline; ``*`` may
cross folders (``fnmatch``), both ways. The split form downloads every data file of the repo (parquet, arrow,
jsonl, json, csv) and its README.md (whose ``configs:`` name the subsets), then ``datasets.load_dataset(<snapshot>,
<subset>, split=<split>)`` reads them: no loading script is fetched or run. A data set ModelScope serves only through
``MsDataset``'s OSS storage, with no files in its repo, is refused in words.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import json
import os
import re
import tempfile
from dataclasses import dataclass
from typing import Callable, Optional

from npu_rl.data.builtin import cache_dir as npu_rl_cache_dir
from npu_rl.data.io import DATA_SUFFIXES, GLOB, split_query, write_parquet
from npu_rl.utils.hf_env import describe_error, is_offline
from npu_rl.utils.modelscope_env import (
    PREFIX,
    cache_dir,
    endpoint,
    list_repo,
    lock_path,
    require_package,
    use_modelscope,
)
from npu_rl.utils.redact import redact_url

# what the split form downloads: the files ``datasets`` reads from a folder of data files, and the card
SPLIT_SUFFIXES = (".parquet", ".arrow", ".jsonl", ".json", ".csv", ".jsonl.gz", ".json.gz", ".csv.gz")
CARD = "README.md"
NOT_DATA = ("dataset_infos.json", "dataset_info.json", "state.json")  # datasets' metadata, not rows
_NAME = re.compile(r"[\w.-]+")


@dataclass(frozen=True)
class ModelScopeData:
    repo_id: str  # owner/name
    revision: Optional[str]
    path: str  # split form: the subset ("" for none); file form: the file or glob in the repo
    split: Optional[str]  # None: the file form
    item: str  # the entry as given
    explicit: bool  # modelscope://, not a plain id under VERL_USE_MODELSCOPE

    @property
    def label(self) -> str:
        """How errors name the entry."""
        if self.explicit:
            return repr(self.item)
        return f"{self.item!r} (no local file has that name and VERL_USE_MODELSCOPE is set: a ModelScope data set)"


def _bad(item: str, why: str) -> ValueError:
    return ValueError(f"{item!r} is not a ModelScope data set path ({why}): give modelscope://<owner>/<name>[@rev]/"
                      "<file or glob> or modelscope://<owner>/<name>[@rev][/<subset>]?split=<split>")


def parse_modelscope_data(item: str) -> Optional[ModelScopeData]:
    """The ModelScope data set an entry of ``data.*_files`` names: ``modelscope://...``, or a plain
    ``owner/name[@rev]/<file>`` / ``owner/name?split=`` while ``VERL_USE_MODELSCOPE`` is set; None otherwise (the
    caller checks that no local path of that name exists first). A ``modelscope://`` entry that names no data set is
    a ValueError."""
    explicit = item.startswith(PREFIX)
    if not explicit and (not use_modelscope() or "://" in item or item.startswith(("/", "~", ".", "$"))):
        return None
    head, query = split_query(item[len(PREFIX):] if explicit else item)
    parts = head.split("/")
    if len(parts) < 2:
        if explicit:
            raise _bad(item, "no <owner>/<name>")
        return None
    name, _, revision = parts[1].partition("@")
    names_ok = _NAME.fullmatch(parts[0]) and _NAME.fullmatch(name) and not {parts[0], name} & {".", ".."}
    rest = parts[2:]
    if not names_ok or any(p in ("", ".", "..") for p in rest) or (revision and not _NAME.fullmatch(revision)):
        if explicit:
            raise _bad(item, "an owner, a name, a revision or a path part that cannot be one")
        return None
    repo_id, path = f"{parts[0]}/{name}", "/".join(rest)
    revision = query.get("revision") or revision or None
    if path and (path.lower().endswith(DATA_SUFFIXES) or GLOB.search(path)):
        if "split" in query:
            if not explicit:
                return None
            raise ValueError(f"{item!r}: a file path in a ModelScope data set takes no ?split= (the file is the split)")
        return ModelScopeData(repo_id, revision, path, None, item, explicit)
    if "split" not in query or len(rest) > 1:
        if explicit:
            raise _bad(item, f"{path!r} is neither a parquet/jsonl file nor a glob" if len(rest) > 1 or "split" in query
                       else "name a split (?split=train) or a file in the repo")
        return None
    if not query["split"]:
        if not explicit:
            return None
        raise ValueError(f"{item!r}: ?split= is empty; name a split of the data set (train, test ...)")
    return ModelScopeData(repo_id, revision, path, query["split"], item, explicit)


# ------------------------------------------------------------------------------------------------------- the cache
def _cached_snapshot(ds: ModelScopeData) -> Optional[str]:
    """The data set's snapshot folder in modelscope's cache (whatever files it holds), or None. No network."""
    if importlib.util.find_spec("modelscope") is None:
        return None
    from modelscope import snapshot_download

    try:  # master, ModelScope's default branch, when no revision is named: not whichever snapshot is cached
        folder = str(snapshot_download(repo_id=ds.repo_id, repo_type="dataset", revision=ds.revision or "master",
                                       cache_dir=cache_dir(), local_files_only=True))
    except Exception:  # modelscope's CacheNotFound ...
        return None
    return folder if os.path.isdir(folder) else None


def _files_in(folder: str) -> list[str]:
    """The files under ``folder`` as repo paths (``data/train.parquet``)."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [os.path.relpath(os.path.join(root, f), folder).replace(os.sep, "/") for f in files]
    return sorted(found)


def _not_cached(ds: ModelScopeData, what: str) -> FileNotFoundError:
    revision = f" --revision {ds.revision}" if ds.revision else ""
    files = f" --include '{ds.path}'" if ds.split is None else ""
    return FileNotFoundError(
        f"{ds.label}: {what} in the ModelScope cache ({cache_dir()}), and HF_HUB_OFFLINE is set. "
        f"Download it once online (`modelscope download --repo-type dataset {ds.repo_id}{revision}{files}`, or unset "
        "HF_HUB_OFFLINE), point MODELSCOPE_CACHE at the cache that has it, or give a local file")


# ----------------------------------------------------------------------------------------------------- downloading
def _download(ds: ModelScopeData, choose: Callable[[list[str]], list[str]],
              cached: Optional[Callable[[], Optional[str]]] = None) -> tuple[str, list[str]]:
    """Under the node's lock: ``cached()`` when it finds the file (another process of this node fetched it while we
    waited), else the repo's listing, the files ``choose`` picks from it, downloaded (modelscope skips those already
    cached). (snapshot folder, chosen repo paths)."""
    from filelock import FileLock
    from modelscope import snapshot_download

    with FileLock(lock_path("datasets", ds.repo_id)):
        folder = cached() if cached is not None else None
        if folder is not None:
            return folder, [ds.path]
        chosen = sorted(choose(list_repo("datasets", ds.repo_id, ds.revision, ds.label)))
        try:
            folder = str(snapshot_download(repo_id=ds.repo_id, repo_type="dataset", revision=ds.revision,
                                           cache_dir=cache_dir(), endpoint=endpoint(), allow_patterns=chosen))
        except Exception as exc:  # the connection dropped, a file failed its checksum, the disk filled ...
            raise FileNotFoundError(f"{ds.label}: download from {redact_url(endpoint())} failed: "
                                    f"{type(exc).__name__}: {redact_url(str(exc))}") from exc
    missing = [n for n in chosen if not os.path.isfile(os.path.join(folder, n))]
    if missing:
        raise FileNotFoundError(f"{ds.label}: {redact_url(endpoint())} listed {missing[0]} but the download left no "
                                f"such file in {folder}")
    return folder, chosen


def _resolve_files(ds: ModelScopeData) -> list[str]:
    pattern, is_glob = ds.path, bool(GLOB.search(ds.path))

    def cached_file() -> Optional[str]:
        folder = _cached_snapshot(ds)
        return folder if folder and os.path.isfile(os.path.join(folder, pattern)) else None

    folder = None if is_glob else cached_file()
    if folder is not None:
        return [os.path.join(folder, pattern)]
    if is_offline():
        folder = _cached_snapshot(ds) if is_glob else None
        names = [n for n in _files_in(folder) if fnmatch.fnmatch(n, pattern)] if folder else []
        if not names:
            raise _not_cached(ds, "no file matching the pattern" if is_glob else f"no file {pattern}")
        return [os.path.join(folder, n) for n in names]

    def choose(listing: list[str]) -> list[str]:
        names = [n for n in listing if fnmatch.fnmatch(n, pattern)] if is_glob else [n for n in listing if n == pattern]
        if not names:
            what = "the pattern matches no file of" if is_glob else f"there is no file {pattern} in"
            raise FileNotFoundError(f"{ds.label}: {what} the data set repo {ds.repo_id} on {redact_url(endpoint())} "
                                    f"(it has {len(listing)} files: {', '.join(listing[:5])}"
                                    f"{' ...' if len(listing) > 5 else ''})")
        return names

    folder, names = _download(ds, choose, None if is_glob else cached_file)
    return [os.path.join(folder, n) for n in names]


def _is_split_data(name: str) -> bool:
    return name.lower().endswith(SPLIT_SUFFIXES) and os.path.basename(name) not in NOT_DATA


def _resolve_split(ds: ModelScopeData) -> str:
    key = {"repo": ds.repo_id, "subset": ds.path or None, "split": ds.split, "revision": ds.revision}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    path = os.path.join(npu_rl_cache_dir(), "modelscope", f"{ds.repo_id.replace('/', '--')}-{digest}",
                        f"{ds.split}.parquet")
    if os.path.isfile(path):
        return path
    if is_offline():
        folder = _cached_snapshot(ds)
        if folder is None or not any(_is_split_data(n) for n in _files_in(folder)):
            raise _not_cached(ds, "no data file of the set")
    else:
        def choose(listing: list[str]) -> list[str]:
            data = [n for n in listing if _is_split_data(n)]
            if not data:
                raise FileNotFoundError(
                    f"{ds.label}: the data set repo {ds.repo_id} on {redact_url(endpoint())} holds no data files "
                    f"({', '.join(SPLIT_SUFFIXES)}) for datasets to read (it has {', '.join(listing[:5]) or 'none'}"
                    f"{' ...' if len(listing) > 5 else ''}); a set served only through MsDataset's storage is not "
                    "read here: save it with MsDataset.load(...).to_hf_dataset().save_to_disk(DIR) and give DIR")
            return data + [n for n in listing if n == CARD]

        folder, _ = _download(ds, choose)
    try:
        from datasets import load_dataset
    except ImportError as exc:
        raise ValueError(f"{ds.label}: reading a split of a data set needs pip install datasets") from exc
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # datasets' arrow copy goes to a folder of ours beside the parquet and is gone once the rows are written
    with tempfile.TemporaryDirectory(dir=os.path.dirname(path), prefix=".arrow-") as arrow:
        try:
            rows = load_dataset(folder, ds.path or None, split=ds.split, cache_dir=arrow).to_list()
        except Exception as exc:  # an unknown split or subset, files datasets cannot read ...
            raise FileNotFoundError(f"{ds.label}: datasets.load_dataset({folder!r}, {ds.path or None!r}, "
                                    f"split={ds.split!r}) failed: {describe_error(exc)}") from exc
    write_parquet(rows, path)
    return path


def resolve_modelscope_data(ds: ModelScopeData) -> list[str]:
    """The local files of a ModelScope data set entry (several for a glob); raises naming the entry."""
    require_package(ds.label, "data set")
    return _resolve_files(ds) if ds.split is None else [_resolve_split(ds)]
