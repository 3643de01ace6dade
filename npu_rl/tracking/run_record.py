"""What a run folder keeps besides its metrics: the resolved config and the exact command that started the run.

    <run_dir>/config.yaml    every key, resolved (no ${...} left): `npu-rl train --config-path <run_dir>
                             --config-name config` runs the same configuration again
    <run_dir>/command.json   argv, working directory, Python, npu-rl version, host, start time, the environment
                             variables that change behaviour (DEVICE, *_VISIBLE_DEVICES, NPU_RL_*, VLLM_*, HCCL_*)
Secrets are masked in all three (npu_rl.utils.redact: URL credentials, *_API_KEY / *_TOKEN / *SECRET* /
*PASSWORD* values); the run itself receives the real values.
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

import npu_rl
from npu_rl.utils.redact import ENV_KEYS_ATTRIBUTE, MASK, env_interpolated_keys, mask_env_values, redact_argv, \
    redact_environment, redact_mapping

_ENV_PREFIXES = ("DEVICE", "ASCEND_", "CUDA_VISIBLE", "NPU_RL_", "VLLM_", "HCCL_", "TASK_QUEUE", "RAY_ADDRESS",
                 "TENSORBOARD_DIR", "SWANLAB_", "MLFLOW_", "WANDB_", "CLEARML_", "TRACKIO_",
                 "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "PYTORCH_", "VERL_USE_MODELSCOPE", "MODELSCOPE_")


def recorded_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The behaviour-changing environment variables, secrets masked by :mod:`npu_rl.utils.redact` (a secret-named
    variable keeps its name; credentials in a URL such as ``MLFLOW_TRACKING_URI`` are masked)."""
    environ = dict(os.environ if environ is None else environ)
    return redact_environment({key: environ[key] for key in sorted(environ) if key.startswith(_ENV_PREFIXES)})


def recorded_config(config: Any) -> dict[str, Any]:
    """The config tree as it may be written down or handed to a tracker: resolved, then secrets masked, and every
    value that came from ``${oc.env:...}`` masked whatever its key and whatever the variable (the places a loaded
    config remembers, and those still written as interpolations). The run itself keeps the real values."""
    from omegaconf import OmegaConf

    node = OmegaConf.structured(config) if not OmegaConf.is_config(config) else config
    resolved = OmegaConf.to_container(node, resolve=True)
    places = list(getattr(config, ENV_KEYS_ATTRIBUTE, ())) + env_interpolated_keys(
        OmegaConf.to_container(node, resolve=False))
    return redact_mapping(mask_env_values(resolved, places))


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


    os.makedirs(run_dir, exist_ok=True)
    paths = {"config": os.path.join(run_dir, "config.yaml"), "command": os.path.join(run_dir, "command.json"),
             "shell": os.path.join(run_dir, "command.sh")}
    with open(paths["config"], "w", encoding="utf-8") as f:
        f.write("# The resolved configuration of this run (written by npu-rl at its start).\n")
        f.write("# Run it again: npu-rl train --config-path <this folder> --config-name config\n")
        f.write(f"# Secrets are written as {MASK}: give them again (an override, or ${{oc.env:NAME}}).\n")
        f.write("defaults:\n  - npu_rl_schema\n  - _self_\n\n")  # typed against the schema when loaded again
        f.write(OmegaConf.to_yaml(OmegaConf.create(recorded_config(config))))
    command = redact_argv(list(command) if command is not None else command_line())
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
