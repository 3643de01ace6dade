"""Experiment tracking (``trainer.logger``): console, a JSONL file per run (always), and TensorBoard, wandb,
SwanLab, MLflow, Trackio, ClearML through accelerate's trackers (backends.py: where each writes, which environment
variables it honours, offline by default).

Every backend receives the same flat ``{key: float}`` dict per step. The third-party ones are imported only when
chosen; a missing package or an online mode without credentials is a config error (backends.check_trackers, run
at validation), found before any model loads. Validation samples written to ``val_generations.jsonl``
(``trainer.log_val_generations``) are forwarded as tables to the trackers that have them.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Protocol  # noqa: F401

from npu_rl.tracking.backends import PACKAGES, make_backend

# The step line's default keys (prefixes): the losses appear when the algorithm has them (actor/kl_loss with
# use_kl_loss, critic/vf_loss with a critic). trainer.console_keys replaces the list.
CONSOLE_KEYS = (
    "critic/score/mean", "val-core", "actor/pg_loss", "actor/kl_loss", "critic/vf_loss", "actor/entropy",
    "actor/ppo_kl", "actor/grad_norm", "response_length/mean", "timing_s/step", "perf/throughput",
)


class TrackerBackend(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def _fmt(value: float) -> str:
    if isinstance(value, float) and (abs(value) >= 1e4 or (abs(value) < 1e-3 and value != 0)):
        return f"{value:.3e}"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _write_below_progress_bar(line: str) -> None:
    """Step lines are the run's output: stdout (``npu-rl train > log`` keeps them), written below the progress bar
    (which lives on stderr)."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


class ConsoleBackend:
    """One line per step with the keys people watch (``keys``: prefixes); everything goes to the JSONL file."""

    def __init__(self, write=None, keys: tuple[str, ...] | None = None):
        self._write = write or _write_below_progress_bar
        self.keys = tuple(keys) if keys else CONSOLE_KEYS

    def log(self, metrics: dict[str, float], step: int) -> None:
        shown = {k: v for k, v in metrics.items() if k.startswith(self.keys)}
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


class Tracker:
    """Fans a step's metrics out to every chosen backend."""

    def __init__(self, loggers: list[str], project: str, experiment: str, run_dir: str,
                 config: dict[str, Any] | None = None, console_write=None, console_keys=None):
        self.run_dir = run_dir
        self.jsonl_path = os.path.join(run_dir, "metrics.jsonl")
        self.generations_path = os.path.join(run_dir, "val_generations.jsonl")
        self._generations_offset = 0
        self.backends: list[TrackerBackend] = []

        for name in loggers:
            try:
                self.backends.append(self._make(name, project, experiment, config or {}, console_write, console_keys))
            except ImportError as exc:
                module, requirement = PACKAGES.get(name, (name, name))
                raise ImportError(f"trainer.logger={name!r} needs the {module} package: pip install {requirement} "
                                  f"({exc})") from exc
        if not any(isinstance(b, JsonlBackend) for b in self.backends):
            self.backends.append(JsonlBackend(self.jsonl_path))  # every run keeps its metrics on disk

    def _make(self, name, project, experiment, config, console_write, console_keys=None) -> TrackerBackend:
        if name == "console":
            return ConsoleBackend(console_write, console_keys)
        if name in ("file", "jsonl"):
            return JsonlBackend(self.jsonl_path)

        if name in PACKAGES:
            return make_backend(name, self.run_dir, project, experiment, config)
        raise ValueError(f"unknown logger {name!r} (trainer.logger)")

    def log(self, metrics: dict[str, float], step: int) -> None:
        for backend in self.backends:
            backend.log(metrics, step)
        self._forward_generations(step)

    def _forward_generations(self, step: int) -> None:
        """Validation samples appended to val_generations.jsonl since the last step -> trackers with tables."""
        takers = [b for b in self.backends if hasattr(b, "log_generations")]
        if not takers or not os.path.isfile(self.generations_path):
            return
        with open(self.generations_path, "rb") as f:
            f.seek(self._generations_offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next step
        self._generations_offset += len(complete)
        rows = [json.loads(line) for line in complete.decode("utf-8").splitlines() if line.strip()]
        if rows:
            for backend in takers:
                backend.log_generations(rows, step)

    def close(self) -> None:
        for backend in self.backends:
            backend.close()
