"""npu-rl: Ascend-NPU-first RL post-training of LLMs with verl's workflow.

``npu_rl.Trainer`` (the Python API, npu_rl/api.py) is imported on first use, so ``import npu_rl`` stays light."""

__version__ = "0.1.0"

_LAZY = {"Trainer": "npu_rl.api", "TrainResult": "npu_rl.api"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'npu_rl' has no attribute {name!r}")
