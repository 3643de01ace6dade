"""npu-rl: Ascend-NPU-first RL post-training of LLMs with verl's workflow.

``npu_rl.Trainer`` (the Python API, npu_rl/api.py) is imported on first use, so ``import npu_rl`` stays light.

The fused kernels and the Hydra YAML sit at the top of the repository (``kernels/``, ``configs/``) and import as
``npu_rl.kernels`` and ``npu_rl.configs``: an install (wheel or editable) maps them through setup.py's
``package_dir``. A checkout used without installing it (a Ray job's uploaded working folder, ``PYTHONPATH=<clone>``)
has them beside this folder, so the folder above joins this package's search path, in that case only."""

import os as _os

__version__ = "0.1.0"

_LAZY = {"Trainer": "npu_rl.api", "TrainResult": "npu_rl.api"}

_here = _os.path.dirname(_os.path.abspath(__file__))
_checkout = _os.path.dirname(_here)
if (not _os.path.isdir(_os.path.join(_here, "kernels"))
        and _os.path.isfile(_os.path.join(_checkout, "kernels", "__init__.py"))
        and _os.path.isfile(_os.path.join(_checkout, "configs", "ppo_trainer.yaml"))):
    __path__.append(_checkout)  # noqa: F821 (a package's __path__)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'npu_rl' has no attribute {name!r}")
