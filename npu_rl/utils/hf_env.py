"""The Hugging Face environment, read at call time (huggingface_hub reads it once, at import): offline mode, the
Hub cache folder, the endpoint, and the bound on every call to it. One reading for models (``npu_rl.models.hub``)
and data (``npu_rl.data.sources``).

A Hub or mirror that accepts a connection and never answers would hold a run forever: huggingface_hub's shared
client has no timeout (``model_info``, file listings), and a file's metadata request is retried with a 60 s timeout
five times. So every metadata call (a repo's info, a listing, a file's metadata) runs under ``hub_call``: it ends
within ``NPU_RL_HUB_TIMEOUT_S`` seconds (default 60) whatever the library does inside, with an error naming the id
or path and the endpoint (credentials masked, in huggingface_hub's own log lines too); and the shared client gets that
timeout for each read, so a byte transfer that stalls ends too (a download that keeps moving is not cut: a large model
takes its time). A Hub data set read through ``datasets.load_dataset`` (many requests, and retries inside) has an
overall deadline as well, ``NPU_RL_HUB_LOAD_TIMEOUT_S`` (default 1800 s): a mirror that trickles a byte at a time
passes every per-read timeout, and only that ends it.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Callable, TypeVar

from npu_rl.utils.redact import install_log_redaction, redact_text, redact_url

TRUTHY = ("1", "ON", "YES", "TRUE")  # how an environment switch says yes (HF_HUB_OFFLINE, VERL_USE_MODELSCOPE)
DEFAULT_ENDPOINT = "https://huggingface.co"
TIMEOUT_VARIABLE = "NPU_RL_HUB_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 60.0
LOAD_TIMEOUT_VARIABLE = "NPU_RL_HUB_LOAD_TIMEOUT_S"
DEFAULT_LOAD_TIMEOUT_S = 1800.0
_T = TypeVar("_T")
_client_timeout: list[float] = []  # the timeout the shared client was given (set_client_factory closes the old)
_client_lock = threading.Lock()


def is_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or transformers' ``TRANSFORMERS_OFFLINE``) is set to a true value."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in TRUTHY


def hub_cache_dir() -> str:
    """``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub`` (``XDG_CACHE_HOME`` honoured)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.path.expandvars(os.environ["HF_HUB_CACHE"]))
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return os.path.join(os.path.expanduser(os.path.expandvars(home)), "hub")


def hub_endpoint() -> str | None:
    """``HF_ENDPOINT`` (a mirror), or None for the Hub itself."""
    return os.environ.get("HF_ENDPOINT") or None


def shown_endpoint(endpoint: str | None = None) -> str:
    """The endpoint as a message may show it: credentials in the URL masked."""
    return redact_url(endpoint or hub_endpoint() or DEFAULT_ENDPOINT)


def hub_timeout_s() -> float:
    """``NPU_RL_HUB_TIMEOUT_S``: seconds one Hub call may take (a positive, finite number)."""
    return _seconds(TIMEOUT_VARIABLE, DEFAULT_TIMEOUT_S)


def hub_load_timeout_s() -> float:
    """``NPU_RL_HUB_LOAD_TIMEOUT_S``: seconds a whole ``load_dataset`` of a Hub data set may take."""
    return _seconds(LOAD_TIMEOUT_VARIABLE, DEFAULT_LOAD_TIMEOUT_S)


def _seconds(variable: str, default: float) -> float:
    raw = os.environ.get(variable)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{variable}={raw!r} must be a positive number of seconds")
    return value


def bound_client(timeout: float) -> None:
    """Give huggingface_hub's shared HTTP client ``timeout`` seconds for connecting and for each read."""
    import httpx2  # huggingface_hub's own HTTP package
    from huggingface_hub.utils import _http

    install_log_redaction()  # huggingface_hub logs each retried URL, an HF_ENDPOINT's credentials included
    with _client_lock:
        if _client_timeout == [timeout]:
            return

        def factory():
            client = _http.default_client_factory()
            client.timeout = httpx2.Timeout(timeout)
            return client

        _http.set_client_factory(factory)
        _client_timeout[:] = [timeout]


def hub_call(call: Callable[[], _T], what: str, endpoint: str | None = None, overall: bool = False) -> _T:
    """``call()`` (a request to the Hub about ``what``), ended after ``hub_timeout_s()`` with a ``TimeoutError``
    naming ``what`` and the endpoint. The call runs in a daemon thread: one that the library keeps retrying is left
    to end on its own (its reads time out too), never waited for. ``overall``: ``call`` is a whole load (many
    requests), ended after ``hub_load_timeout_s()`` instead; each of its reads still times out after
    ``hub_timeout_s()``."""
    variable = LOAD_TIMEOUT_VARIABLE if overall else TIMEOUT_VARIABLE
    timeout = hub_load_timeout_s() if overall else hub_timeout_s()
    bound_client(hub_timeout_s())
    result: dict = {}
    done = threading.Event()

    def run() -> None:
        try:
            result["value"] = call()
        except BaseException as exc:  # handed to the caller's thread as it is
            result["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name=f"npu-rl hub call: {what}", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError(f"{what}: {shown_endpoint(endpoint)} did not {'finish' if overall else 'answer'} within "
                           f"{timeout:g} s ({variable}); check the network or the mirror, or set HF_HUB_OFFLINE=1 "
                           f"to use only the cache ({hub_cache_dir()})")
    if "error" in result:
        raise result["error"]
    return result["value"]


def describe_error(exc: BaseException) -> str:
    """``Type: first line`` of an exception from a Hub call, URL credentials and secrets masked."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return redact_text(f"{type(exc).__name__}: {text}")
