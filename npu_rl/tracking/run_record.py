"""What a run folder keeps besides its metrics: the resolved config and the exact command that started the run.

    <run_dir>/config.yaml    every key, resolved (no ${...} left): `npu-rl train --config-path <run_dir>
                             --config-name config` runs the same configuration again
    <run_dir>/command.json   argv, working directory, Python, npu-rl version, host, start time, the environment
                             variables that change behaviour (DEVICE, *_VISIBLE_DEVICES, NPU_RL_*, VLLM_*, HCCL_*)
    <run_dir>/command.sh     the same command, shell-quoted, runnable from the recorded working directory

Hydra keeps the resolved config beside a verl run (``.hydra/config.yaml``); this is the equivalent.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time
from typing import Any

_ENV_PREFIXES = ("DEVICE", "ASCEND_", "CUDA_VISIBLE", "NPU_RL_", "VLLM_", "HCCL_", "TASK_QUEUE", "RAY_ADDRESS",
                 "TENSORBOARD_DIR", "SWANLAB_", "MLFLOW_", "WANDB_", "CLEARML_", "TRACKIO_",
                 "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "PYTORCH_")
_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


def recorded_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The behaviour-changing environment variables, secrets left out (their names are kept, values are not)."""
    environ = dict(os.environ if environ is None else environ)
    out = {}
    for key in sorted(environ):
        if key.startswith(_ENV_PREFIXES):
            out[key] = "<set>" if any(w in key for w in _SECRET_WORDS) else environ[key]
    return out


def command_line(argv: list[str] | None = None) -> list[str]:
    """``sys.argv`` as the user typed it: ``npu-rl ...`` for the console script, ``python -m ...`` for main_ppo."""
    argv = list(sys.argv if argv is None else argv)
    prog = os.path.basename(argv[0]) if argv else "npu-rl"
    if prog == "npu-rl" or prog.endswith("cli.py"):
        return ["npu-rl"] + argv[1:]
    if prog == "main_ppo.py":
        return ["python", "-m", "npu_rl.trainer.main_ppo"] + argv[1:]
    return [prog] + argv[1:]


def save_run_record(run_dir: str, config: Any, command: list[str] | None = None) -> dict[str, str]:
    """Write config.yaml, command.json and command.sh into ``run_dir``; returns their paths. ``command``: the full
    command (``["npu-rl", "train", ...]``); default: from ``sys.argv``."""
    from omegaconf import OmegaConf

    import npu_rl

    os.makedirs(run_dir, exist_ok=True)
    node = OmegaConf.structured(config) if not OmegaConf.is_config(config) else config
    paths = {"config": os.path.join(run_dir, "config.yaml"), "command": os.path.join(run_dir, "command.json"),
             "shell": os.path.join(run_dir, "command.sh")}
    with open(paths["config"], "w", encoding="utf-8") as f:
        f.write("# The resolved configuration of this run (written by npu-rl at its start).\n")
        f.write("# Run it again: npu-rl train --config-path <this folder> --config-name config\n")
        f.write("defaults:\n  - npu_rl_schema\n  - _self_\n\n")  # typed against the schema when loaded again
        f.write(OmegaConf.to_yaml(node, resolve=True))
    command = list(command) if command is not None else command_line()
    record = {
        "argv": command,
        "cwd": os.getcwd(),
        "python": sys.executable,
        "npu_rl_version": getattr(npu_rl, "__version__", "unknown"),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": recorded_environment(),
    }
    with open(paths["command"], "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    with open(paths["shell"], "w", encoding="utf-8") as f:
        f.write("#!/usr/bin/env bash\n# The command that started this run, from its working directory.\n")
        f.write(f"cd {shlex.quote(record['cwd'])}\n{shlex.join(command)}\n")
    return paths
