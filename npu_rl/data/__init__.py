"""Prompt data: verl-schema parquet/JSONL, preprocessing of local data sets, built-in generated tasks, the loader.

Entry points (imported lazily, so ``npu_rl.data.preprocess`` and the reward workers stay free of torch):
``build_dataloader`` / ``build_dataset`` (loader.py), ``resolve_data_files`` (sources.py: local files, globs, save_to_disk folders, hf://, modelscope:// through modelscope_sets.py), ``resolve_builtin`` (builtin.py),
``preprocess_main`` (preprocess.py, the body of ``npu-rl preprocess``), ``ArithSpec`` / ``generate_arith``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "build_dataloader": "npu_rl.data.loader",
    "build_dataset": "npu_rl.data.loader",
    "PromptDataLoader": "npu_rl.data.loader",
    "PromptCollator": "npu_rl.data.loader",
    "PromptDataset": "npu_rl.data.dataset",
    "resolve_data_files": "npu_rl.data.sources",
    "resolve_builtin": "npu_rl.data.builtin",
    "preprocess_main": "npu_rl.data.preprocess",
    "ArithSpec": "npu_rl.data.arith",
    "generate_arith": "npu_rl.data.arith",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'npu_rl.data' has no attribute {name!r}")
