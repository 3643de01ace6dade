"""The ModelScope environment, read at call time, and the one request npu-rl makes itself: a repo's file list. One
reading for model ids (``npu_rl.models.modelscope_hub``) and data set ids (``npu_rl.data.modelscope_sets``).

- ``VERL_USE_MODELSCOPE`` (verl's switch): plain ``owner/name`` ids go to ModelScope instead of the Hugging Face Hub;
- ``MODELSCOPE_CACHE``, else ``~/.cache/modelscope``: the cache (``models/<owner>--<name>/snapshots/<revision>``,
  ``datasets/<owner>--<name>/snapshots/<revision>``), as the ``modelscope`` package reads it;
- ``MODELSCOPE_ENDPOINT``, else ``MODELSCOPE_DOMAIN``, else https://modelscope.cn: the server;
- offline: ModelScope has no switch of its own, so ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) holds for it too
  (``npu_rl.utils.hf_env.is_offline``);
- ``MODELSCOPE_API_TIMEOUT`` (seconds, 60 by default, as in modelscope): the bound on a listing request.

Listings: ``GET /api/v1/models/<id>/repo/files?Revision=&Recursive=True`` for a model (one answer) and
``GET /api/v1/datasets/<id>/repo/tree?Revision=&Recursive=True&PageNumber=&PageSize=`` for a data set (paged), the
requests modelscope-hub 0.5 (under modelscope 1.40) makes; the files themselves are downloaded by the package.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import urllib.error
import urllib.parse
import urllib.request

from npu_rl.utils.hf_env import TRUTHY
from npu_rl.utils.redact import redact_url

PREFIX = "modelscope://"
DEFAULT_ENDPOINT = "https://modelscope.cn"
PAGE_SIZE = 200  # modelscope-hub's page size for data set listings


def use_modelscope() -> bool:
    """verl's switch: ``VERL_USE_MODELSCOPE`` (verl reads ``true``; 1 / on / yes count too)."""
    return os.environ.get("VERL_USE_MODELSCOPE", "").upper() in TRUTHY


def cache_dir() -> str:
    """``MODELSCOPE_CACHE``, else ``~/.cache/modelscope`` (as modelscope reads it)."""
    return os.path.expanduser(os.path.expandvars(os.environ.get("MODELSCOPE_CACHE") or "~/.cache/modelscope"))


def endpoint() -> str:
    """``MODELSCOPE_ENDPOINT``, else ``MODELSCOPE_DOMAIN`` (https:// added to a bare domain), else modelscope.cn."""
    value = (os.environ.get("MODELSCOPE_ENDPOINT") or os.environ.get("MODELSCOPE_DOMAIN") or "").strip()
    if not value:
        return DEFAULT_ENDPOINT
    if not value.lower().startswith(("http://", "https://")):
        value = "https://" + value
    return value.rstrip("/")


def api_timeout() -> float:
    value = os.environ.get("MODELSCOPE_API_TIMEOUT", "60")
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ValueError(f"MODELSCOPE_API_TIMEOUT={value!r} is not a positive number of seconds")
    return seconds


def require_package(label: str, what: str = "model id") -> None:
    """ImportError naming ``label`` when the modelscope package is missing."""
    if importlib.util.find_spec("modelscope") is None:
        raise ImportError(f"{label} is a ModelScope {what}, and the modelscope package is not installed: "
                          "pip install modelscope (or npu-rl[modelscope])"
                          + (" (VERL_USE_MODELSCOPE is set)" if use_modelscope() else ""))


def lock_path(kind: str, repo_id: str) -> str:
    """The file lock under which one process of a node downloads ``repo_id`` (kind ``models`` or ``datasets``)."""
    locks = os.path.join(cache_dir(), ".locks", "npu_rl")
    os.makedirs(locks, exist_ok=True)
    prefix = "" if kind == "models" else "datasets--"  # models keep the name they had before data sets came
    return os.path.join(locks, prefix + repo_id.replace("/", "--") + ".lock")


def _request(url: str) -> urllib.request.Request:
    """A GET of ``url``; a user:password@ in it (a proxy or mirror that wants one) goes into a Basic auth header,
    since urllib does not read it from the URL."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return urllib.request.Request(url)
    userinfo, host = parts.netloc.rsplit("@", 1)
    token = base64.b64encode(urllib.parse.unquote(userinfo).encode()).decode()
    return urllib.request.Request(urllib.parse.urlunsplit(parts._replace(netloc=host)),
                                  headers={"Authorization": f"Basic {token}"})


def _get_json(url: str, label: str, revision: str | None, repo_id: str, what: str) -> object:
    where = redact_url(endpoint())
    timeout = api_timeout()
    try:
        with urllib.request.urlopen(_request(url), timeout=timeout) as response:
            return json.loads(response.read().decode())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            missing = f"revision {revision!r} of" if revision else f"such {what} as"
            raise FileNotFoundError(f"{label}: {where} has no {missing} {repo_id} (or it is private: "
                                    "`modelscope login`)") from exc
        raise FileNotFoundError(f"{label}: {where} answered HTTP {exc.code}") from exc
    except (TimeoutError, urllib.error.URLError, OSError, ValueError) as exc:  # refused, DNS, proxy, not JSON
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):  # connect (URLError) or read (TimeoutError itself)
            raise FileNotFoundError(f"{label}: {where} did not answer within {timeout:g} s (MODELSCOPE_API_TIMEOUT); "
                                    f"set HF_HUB_OFFLINE=1 to use only the cache ({cache_dir()})") from exc
        raise FileNotFoundError(f"{label}: {where} cannot be reached ({type(exc).__name__}: "
                                f"{redact_url(str(reason))}); set HF_HUB_OFFLINE=1 to use only the cache "
                                f"({cache_dir()})") from exc


def _entries(body: object) -> list[dict]:
    data = body.get("Data") if isinstance(body, dict) else None
    entries = data.get("Files") or [] if isinstance(data, dict) else (data or [])
    return [e for e in entries if isinstance(e, dict)]


def list_repo(kind: str, repo_id: str, revision: str | None, label: str) -> list[str]:
    """The file paths of a model (``kind="models"``) or data set (``kind="datasets"``) repo on the server, folders
    left out; every request bounded by MODELSCOPE_API_TIMEOUT; errors name ``label`` and the endpoint (credentials
    masked)."""
    what = "model repo" if kind == "models" else "data set repo"
    query = {"Revision": revision or "master", "Recursive": "True"}
    if kind == "models":
        pages = [_entries(_get_json(f"{endpoint()}/api/v1/models/{repo_id}/repo/files?"
                                    f"{urllib.parse.urlencode(query)}", label, revision, repo_id, what))]
    else:
        pages, number = [], 1
        while True:
            url = (f"{endpoint()}/api/v1/datasets/{repo_id}/repo/tree?"
                   f"{urllib.parse.urlencode({**query, 'PageNumber': number, 'PageSize': PAGE_SIZE})}")
            pages.append(_entries(_get_json(url, label, revision, repo_id, what)))
            if len(pages[-1]) < PAGE_SIZE:
                break
            number += 1
    names = [e.get("Path") or e.get("Name") for page in pages for e in page if e.get("Type", "blob") != "tree"]
    return [n for n in names if n]
