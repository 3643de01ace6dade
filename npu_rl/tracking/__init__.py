"""Experiment tracking: console, a JSONL file per run, TensorBoard, wandb, SwanLab, MLflow (``trainer.logger``).

Every backend receives the same flat ``{key: float}`` dict per step. The third-party ones are imported only when
chosen; a missing package is an error naming the pip install, raised before training starts.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Protocol

CONSOLE_KEYS = (
    "critic/score/mean", "val-core", "actor/pg_loss", "actor/entropy", "actor/ppo_kl", "actor/grad_norm",
    "response_length/mean", "timing_s/step", "perf/throughput",
)
_INSTALL = {"wandb": "wandb", "swanlab": "swanlab", "mlflow": "mlflow", "tensorboard": "tensorboard"}


class TrackerBackend(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def _fmt(value: float) -> str:
    if isinstance(value, float) and (abs(value) >= 1e4 or (abs(value) < 1e-3 and value != 0)):
        return f"{value:.3e}"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _write_below_progress_bar(line: str) -> None:
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)


class ConsoleBackend:
    """One line per step with the keys people watch; everything goes to the JSONL file."""

    def __init__(self, write=None):
        self._write = write or _write_below_progress_bar

    def log(self, metrics: dict[str, float], step: int) -> None:
        shown = {k: v for k, v in metrics.items() if k.startswith(CONSOLE_KEYS)}
        self._write(f"step {step}: " + "  ".join(f"{k}={_fmt(v)}" for k, v in sorted(shown.items())))

    def close(self) -> None:
        pass


class JsonlBackend:
    def __init__(self, path: str):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path = path
        self._file = open(path, "a", encoding="utf-8")

    def log(self, metrics: dict[str, float], step: int) -> None:
        row = {"step": step, "time": time.time()}
        row.update({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()})
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardBackend:
    def __init__(self, log_dir: str):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir)

    def log(self, metrics, step):
        for k, v in metrics.items():
            self._writer.add_scalar(k, v, step)

    def close(self):
        self._writer.close()


class WandbBackend:
    def __init__(self, project: str, experiment: str, config: dict[str, Any]):
        import wandb

        self._run = wandb.init(project=project, name=experiment, config=config)

    def log(self, metrics, step):
        self._run.log(metrics, step=step)

    def close(self):
        self._run.finish()


class SwanlabBackend:
    def __init__(self, project: str, experiment: str, config: dict[str, Any]):
        import swanlab

        self._swanlab = swanlab
        swanlab.init(project=project, experiment_name=experiment, config=config)

    def log(self, metrics, step):
        self._swanlab.log(metrics, step=step)

    def close(self):
        self._swanlab.finish()


class MlflowBackend:
    def __init__(self, project: str, experiment: str, config: dict[str, Any]):
        import mlflow

        self._mlflow = mlflow
        mlflow.set_experiment(project)
        mlflow.start_run(run_name=experiment)
        mlflow.log_params({k: str(v)[:250] for k, v in _flatten(config).items()})

    def log(self, metrics, step):
        self._mlflow.log_metrics({k.replace("@", "_at_"): v for k, v in metrics.items()}, step=step)

    def close(self):
        self._mlflow.end_run()


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class Tracker:
    """Fans a step's metrics out to every chosen backend."""

    def __init__(self, loggers: list[str], project: str, experiment: str, run_dir: str,
                 config: dict[str, Any] | None = None, console_write=None):
        self.run_dir = run_dir
        self.jsonl_path = os.path.join(run_dir, "metrics.jsonl")
        self.backends: list[TrackerBackend] = []
        for name in loggers:
            try:
                self.backends.append(self._make(name, project, experiment, config or {}, console_write))
            except ImportError as exc:
                raise ImportError(f"trainer.logger={name!r} needs the {_INSTALL.get(name, name)} package: "
                                  f"pip install {_INSTALL.get(name, name)}  ({exc})") from exc
        if not any(isinstance(b, JsonlBackend) for b in self.backends):
            self.backends.append(JsonlBackend(self.jsonl_path))  # every run keeps its metrics on disk

    def _make(self, name, project, experiment, config, console_write) -> TrackerBackend:
        if name == "console":
            return ConsoleBackend(console_write)
        if name in ("file", "jsonl"):
            return JsonlBackend(self.jsonl_path)
        if name == "tensorboard":
            return TensorBoardBackend(os.path.join(self.run_dir, "tensorboard"))
        if name == "wandb":
            return WandbBackend(project, experiment, config)
        if name == "swanlab":
            return SwanlabBackend(project, experiment, config)
        if name == "mlflow":
            return MlflowBackend(project, experiment, config)
        raise ValueError(f"unknown logger {name!r} (trainer.logger)")

    def log(self, metrics: dict[str, float], step: int) -> None:
        for backend in self.backends:
            backend.log(metrics, step)

    def close(self) -> None:
        for backend in self.backends:
            backend.close()
