"""Model paths that name the Hugging Face Hub: ``Qwen/Qwen2.5-0.5B-Instruct`` (as verl and transformers take them),
with an optional revision, ``Qwen/Qwen2.5-0.5B-Instruct@<branch|tag|commit>`` (verl has no revision key).

An id is resolved through huggingface_hub's cache, honouring its environment at call time:

- ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``: where snapshots live;
- ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``): only the cache is read; an id not cached fails at validation,
  naming the id and the cache folder;
- ``HF_ENDPOINT``: the Hub (or a mirror) to download from, when online (credentials in it are masked in messages);
- ``NPU_RL_HUB_TIMEOUT_S`` (default 60): the most a request to it may take (``npu_rl.utils.hf_env.hub_call``).

``check_hub_model`` (validation, in the driver) asks the Hub whether the repo exists when it is not cached, so a run
with a wrong id fails before anything heavy; ``resolve_hub_model`` (every rank, the rollout engine) reads the cache
first, so they all open the same snapshot folder (a cached snapshot is used as it is: ``hf download <id>`` brings it
up to date). A download holds a file lock beside the cache, so it happens once per node even when
several ranks ask at once; its files are then checked (``npu_rl.models.snapshot``: a truncated safetensors or a
JSON file that does not parse is named, with the endpoint, instead of failing inside transformers). Only the files a
model needs are fetched: config, tokenizer, weights (safetensors; the ``.bin`` files only when a repo has no
safetensors), chat templates and generation config.

ModelScope ids (``modelscope://owner/name``, or plain ids under ``VERL_USE_MODELSCOPE``) are resolved by
``npu_rl.models.modelscope_hub``. Schemes verl accepts for other stores (``hdfs://`` through its ``copy_to_local``)
and fsspec URLs are refused with the reason: copy the model to a local folder (or the Hub cache) first.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

from npu_rl.models.snapshot import check_downloaded
from npu_rl.utils.hf_env import describe_error, hub_cache_dir, hub_call, hub_endpoint, hub_timeout_s, is_offline, \
    shown_endpoint

REFUSED_SCHEMES = ("hdfs", "s3", "gs", "gcs", "oss", "obs", "abfs", "az", "http", "https", "file", "ms")
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*(?:/[A-Za-z0-9][A-Za-z0-9._-]*)?)(?:@(?P<rev>[\w./-]+))?$")
# weights and tokenizer files; other formats (onnx, gguf, tflite, flax, openvino ...) are never downloaded
WANTED_FILES = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt", "*.jinja", "*.py"]


@dataclass(frozen=True)
class HubId:
    repo_id: str
    revision: Optional[str] = None

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def refused_scheme(path: str) -> Optional[str]:
    """Why ``path`` (a URL of another store) is refused, or None."""
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", path)
    if not match:
        return None
    scheme = match.group(1).lower()
    if scheme == "hdfs":
        return (f"{path!r}: hdfs:// paths (which verl copies with its hdfs_io) are not read here; copy the model to "
                "a local folder (hdfs dfs -get ...) and give that folder")
    return (f"{path!r}: {scheme}:// is not a model location npu-rl reads; give a local folder, a Hugging Face Hub "
            "id such as Qwen/Qwen2.5-0.5B-Instruct (optionally @revision) or a ModelScope id "
            "(modelscope://Qwen/Qwen2.5-0.5B-Instruct)")


def parse_hub_id(path: str) -> Optional[HubId]:
    """The Hub id ``path`` names, or None when it cannot be one (a path with ``~``, ``./``, ``..``, ``//`` ...)."""
    match = _HUB_ID.match(path)
    if not match or ".." in path or "--" in match.group("repo"):
        return None
    return HubId(match.group("repo"), match.group("rev"))


def cached_model(hub_id: HubId) -> Optional[str]:
    """The snapshot folder of ``hub_id`` in the cache, or None. Reads no network. A snapshot counts when it holds a
    config.json and weights, and (where huggingface_hub recorded the repo's file list) no wanted file is missing."""
    from huggingface_hub import snapshot_download

    def local(patterns: list[str]) -> Optional[str]:
        try:
            return snapshot_download(hub_id.repo_id, revision=hub_id.revision, cache_dir=hub_cache_dir(),
                                     local_files_only=True, allow_patterns=patterns)
        except Exception:  # LocalEntryNotFoundError, IncompleteSnapshotError, OSError ...: not usable from the cache
            return None

    folder = local(WANTED_FILES)
    if folder is None or not os.path.isfile(os.path.join(folder, "config.json")):
        return None
    names = os.listdir(folder)
    if not any(n.endswith(".safetensors") for n in names):
        folder = local(WANTED_FILES + ["*.bin"])  # a repo with PyTorch .bin weights only
        if folder is None or not any(n.endswith(".bin") for n in os.listdir(folder)):
            return None
    return folder


def _repo_files(hub_id: HubId, endpoint: Optional[str]) -> list[str]:
    """The files of ``hub_id`` on the Hub (one API call, bounded in time); errors say which id and which Hub."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    where = shown_endpoint(endpoint)
    try:
        info = hub_call(lambda: HfApi(endpoint=endpoint).model_info(hub_id.repo_id, revision=hub_id.revision,
                                                                   timeout=hub_timeout_s()),
                        f"{hub_id}: not a local folder, and asking the Hub about it failed", endpoint)
    except RevisionNotFoundError as exc:
        raise FileNotFoundError(f"{hub_id}: the Hub repo has no revision {hub_id.revision!r} ({where})") from exc
    except RepositoryNotFoundError as exc:
        raise FileNotFoundError(f"{hub_id}: not a local folder, and no such model repo on {where} (or it is "
                                "private or gated: `hf auth login`)") from exc
    except TimeoutError as exc:
        raise FileNotFoundError(str(exc)) from None
    except Exception as exc:  # connection refused (httpx's ConnectError), proxies, HTTP 5xx
        raise FileNotFoundError(f"{hub_id}: not a local folder, and {where} cannot be reached ({describe_error(exc)}"
                                f"); set HF_HUB_OFFLINE=1 to use only the cache ({hub_cache_dir()})") from exc
    names = [s.rfilename for s in (info.siblings or [])]
    if "config.json" not in names:
        raise FileNotFoundError(f"{hub_id}: the Hub repo has no config.json: not a transformers model")
    return names


def _patterns(names: list[str]) -> list[str]:
    """The files to fetch: safetensors when the repo has them, else the PyTorch ``.bin`` files."""
    if any(n.endswith(".safetensors") for n in names):
        return list(WANTED_FILES)
    return WANTED_FILES + ["*.bin"]


def fetch_model(hub_id: HubId) -> str:
    """Download ``hub_id``'s snapshot (once per node: a file lock beside the cache); its folder."""
    from filelock import FileLock
    from huggingface_hub import snapshot_download

    cache = hub_cache_dir()
    locks = os.path.join(cache, ".locks", "npu_rl")
    os.makedirs(locks, exist_ok=True)
    endpoint = hub_endpoint()
    with FileLock(os.path.join(locks, hub_id.repo_id.replace("/", "--") + ".lock")):
        folder = cached_model(hub_id)  # another rank of this node may have fetched it while we waited
        if folder is not None:
            return folder
        patterns = _patterns(_repo_files(hub_id, endpoint))
        try:
            folder = snapshot_download(hub_id.repo_id, revision=hub_id.revision, cache_dir=cache, endpoint=endpoint,
                                       allow_patterns=patterns)
        except Exception as exc:  # the connection dropped, the disk filled ...
            raise FileNotFoundError(f"{hub_id}: download from {shown_endpoint(endpoint)} failed: "
                                    f"{describe_error(exc)}") from exc
    # truncated, or not what it claims; the snapshot's files link to blobs of the repo's cache folder: remove that
    return check_downloaded(folder, str(hub_id), shown_endpoint(endpoint),
                            f"`hf cache delete`, or remove {os.path.dirname(os.path.dirname(folder))}")


def _not_cached(hub_id: HubId) -> FileNotFoundError:
    return FileNotFoundError(
        f"{hub_id!s} is not a local folder, and HF_HUB_OFFLINE is set while the Hub cache ({hub_cache_dir()}) holds "
        f"no snapshot of it. Download it once online (`hf download {hub_id.repo_id}"
        + (f" --revision {hub_id.revision}" if hub_id.revision else "")
        + "`, or unset HF_HUB_OFFLINE), point HF_HOME / HF_HUB_CACHE at the cache that has it, or give a local folder")


def resolve_hub_model(hub_id: HubId) -> str:
    """The local snapshot folder: the cache first (every rank sees the same one), else a download when online."""
    folder = cached_model(hub_id)
    if folder is not None:
        return folder
    if is_offline():
        raise _not_cached(hub_id)
    return fetch_model(hub_id)


def check_hub_model(hub_id: HubId) -> Optional[str]:
    """At validation: the id resolves. Cached: its folder. Offline and not cached: an error naming the id and the
    cache. Online and not cached: the Hub is asked whether the repo (and revision) exists and holds a model; the
    download itself happens when the run starts (``resolve_hub_model``), so ``--cfg job`` stays quick."""
    folder = cached_model(hub_id)
    if folder is not None:
        return folder
    if is_offline():
        raise _not_cached(hub_id)
    _repo_files(hub_id, hub_endpoint())
    return None
