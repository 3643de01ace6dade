"""The Hugging Face environment, read at call time (huggingface_hub reads it once, at import): offline mode and the
Hub cache folder. One reading for models (``npu_rl.models.hub``) and data (``npu_rl.data.sources``)."""

from __future__ import annotations

import os

_TRUE = ("1", "ON", "YES", "TRUE")


def is_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or transformers' ``TRANSFORMERS_OFFLINE``) is set to a true value."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE


def hub_cache_dir() -> str:
    """``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub`` (``XDG_CACHE_HOME`` honoured)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.path.expandvars(os.environ["HF_HUB_CACHE"]))
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return os.path.join(os.path.expanduser(os.path.expandvars(home)), "hub")
