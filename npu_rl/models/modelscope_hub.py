"""Model paths that name ModelScope (modelscope.cn), where most models used on Atlas clusters in China come from:
``modelscope://Qwen/Qwen2.5-0.5B-Instruct[@<branch|tag>]``, or a plain ``Qwen/Qwen2.5-0.5B-Instruct`` while
``VERL_USE_MODELSCOPE`` is true (verl's switch: there every Hub id goes to ModelScope).

An id is resolved through the ``modelscope`` package's cache (``pip install modelscope``), its environment read at
call time by ``npu_rl.utils.modelscope_env`` (shared with data set ids, ``npu_rl.data.modelscope_sets``):

- ``MODELSCOPE_CACHE``, else ``~/.cache/modelscope``: where snapshots live (``models/<owner>--<name>/snapshots/
  <revision>``; the layout of modelscope < 1.38, ``[hub/]models/<owner>/<name with . as ___>``, is read too);
- ``MODELSCOPE_ENDPOINT``, else ``MODELSCOPE_DOMAIN``, else https://modelscope.cn: the server to ask, when online;
- offline: ModelScope has no offline switch of its own, so ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) holds
  for it too, as for Hub ids: only the cache is read, and an id not cached fails at validation naming the id and
  the cache folder;
- ``MODELSCOPE_API_TIMEOUT`` (seconds, 60 by default, as in modelscope): the bound on the validation's request;
  the download itself runs under modelscope's own bounds (``MODELSCOPE_DOWNLOAD_TIMEOUT`` idle, and
  ``MODELSCOPE_DOWNLOAD_TOTAL_TIMEOUT`` per file, read when modelscope is imported; a failed file is retried, then
  the error here names the id and the endpoint, credentials masked; modelscope's own log line of the failed request
  is not masked).

As for Hub ids (``npu_rl.models.hub``): ``check_modelscope_model`` (validation) asks the server for the repo's file
list when the id is not cached; ``resolve_modelscope_model`` (every rank) reads the cache first, else downloads once
per node under a file lock, fetching only config, tokenizer and weights (``.bin`` only when there are no
safetensors). A revision is a branch or tag name (ModelScope's default branch is ``master``).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from npu_rl.models.hub import WANTED_FILES, parse_hub_id
from npu_rl.models.snapshot import check_downloaded
from npu_rl.utils.hf_env import is_offline
from npu_rl.utils.modelscope_env import PREFIX, cache_dir, endpoint, list_repo, lock_path, require_package, \
    use_modelscope
from npu_rl.utils.redact import redact_url


@dataclass(frozen=True)
class ModelScopeId:
    repo_id: str  # owner/name: ModelScope has no ids without an owner
    revision: str | None = None

    def __str__(self) -> str:
        return PREFIX + self.repo_id + (f"@{self.revision}" if self.revision else "")


def parse_modelscope_id(path: str) -> ModelScopeId | None:
    """The ModelScope id ``path`` names: ``modelscope://owner/name[@rev]``, or ``owner/name[@rev]`` while
    ``VERL_USE_MODELSCOPE`` is set; None otherwise. A ``modelscope://`` path that is no id is a ValueError."""
    explicit = path.startswith(PREFIX)
    if not explicit and (not use_modelscope() or os.path.exists(os.path.expanduser(path))):
        return None  # a local folder wins over the switch, as over a Hub id
    hub_id = parse_hub_id(path[len(PREFIX):] if explicit else path)
    if hub_id is None or "/" not in hub_id.repo_id:
        if explicit:
            raise ValueError(f"{path!r} is not a ModelScope model id: give modelscope://<owner>/<name>[@revision], "
                             "for example modelscope://Qwen/Qwen2.5-0.5B-Instruct")
        return None  # a local folder that does not exist, or a one-part name: not ModelScope's
    return ModelScopeId(hub_id.repo_id, hub_id.revision)


def cached_model(ms_id: ModelScopeId) -> str | None:
    """The snapshot folder of ``ms_id`` in modelscope's cache, or None. Reads no network. A snapshot counts when it
    holds a config.json and weights (safetensors or .bin). None too without the modelscope package."""
    if importlib.util.find_spec("modelscope") is None:
        return None
    from modelscope import snapshot_download

    try:  # master, ModelScope's default branch, when no revision is named: not whichever snapshot is cached
        folder = snapshot_download(ms_id.repo_id, revision=ms_id.revision or "master", cache_dir=cache_dir(),
                                   local_files_only=True)
    except Exception:  # modelscope's CacheNotFound ...: not usable from the cache
        return None
    folder = str(folder)
    if not os.path.isfile(os.path.join(folder, "config.json")):
        return None
    if not any(n.endswith((".safetensors", ".bin")) for n in os.listdir(folder)):
        return None
    return folder


def _not_cached(ms_id: ModelScopeId) -> FileNotFoundError:
    revision = f" --revision {ms_id.revision}" if ms_id.revision else ""
    return FileNotFoundError(
        f"{ms_id} is not in the ModelScope cache ({cache_dir()}), and HF_HUB_OFFLINE is set. Download it once online "
        f"(`modelscope download --model {ms_id.repo_id}{revision}`, or unset HF_HUB_OFFLINE), point MODELSCOPE_CACHE at "
        "the cache that has it, or give a local folder")


def repo_files(ms_id: ModelScopeId) -> list[str]:
    """The files of ``ms_id`` on the server (one request, bounded by MODELSCOPE_API_TIMEOUT); errors name the id
    and the endpoint (credentials masked)."""
    names = list_repo("models", ms_id.repo_id, ms_id.revision, str(ms_id))
    if "config.json" not in names:
        raise FileNotFoundError(f"{ms_id}: the ModelScope repo has no config.json: not a transformers model")
    return names


def fetch_model(ms_id: ModelScopeId) -> str:
    """Download ``ms_id``'s snapshot (once per node: a file lock in the cache); its folder."""
    from filelock import FileLock
    from modelscope import snapshot_download

    with FileLock(lock_path("models", ms_id.repo_id)):
        folder = cached_model(ms_id)  # another rank of this node may have fetched it while we waited
        if folder is not None:
            return folder
        names = repo_files(ms_id)
        patterns = list(WANTED_FILES)
        if not any(n.endswith(".safetensors") for n in names):
            patterns.append("*.bin")
        try:
            folder = str(snapshot_download(ms_id.repo_id, revision=ms_id.revision, cache_dir=cache_dir(),
                                           endpoint=endpoint(), allow_patterns=patterns))
        except Exception as exc:  # the connection dropped, a file failed its checksum, the disk filled ...
            raise FileNotFoundError(f"{ms_id}: download from {redact_url(endpoint())} failed: {type(exc).__name__}: "
                                    f"{redact_url(str(exc))}") from exc
    # truncated, or not what it claims (modelscope's checksum covers only the files its server hashed)
    return check_downloaded(folder, str(ms_id), redact_url(endpoint()), f"remove {folder}")


def resolve_modelscope_model(ms_id: ModelScopeId) -> str:
    """The local snapshot folder: the cache first (every rank sees the same one), else a download when online."""
    require_package(str(ms_id))
    folder = cached_model(ms_id)
    if folder is not None:
        return folder
    if is_offline():
        raise _not_cached(ms_id)
    return fetch_model(ms_id)


def check_modelscope_model(ms_id: ModelScopeId) -> str | None:
    """At validation: cached -> its folder; offline and not cached -> an error naming the id and the cache; online
    and not cached -> the server is asked for the repo's files (the download happens when the run starts)."""
    require_package(str(ms_id))
    folder = cached_model(ms_id)
    if folder is not None:
        return folder
    if is_offline():
        raise _not_cached(ms_id)
    repo_files(ms_id)
    return None
