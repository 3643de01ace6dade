"""Third-party trackers through accelerate's trackers (``accelerate.tracking``), set up to work offline.

``trainer.logger`` names; where each writes (``<run>`` is the run folder) and the environment it honours (verl's
names; a variable you set always wins):

=============  ==============================================  ====================================================
tensorboard    ``$TENSORBOARD_DIR`` else ``<run>/tensorboard``   event files; validation samples as text
wandb          ``<run>/wandb`` (``$WANDB_DIR`` wins)              ``WANDB_MODE``; without it: online when
                                                                 ``WANDB_API_KEY`` is set, else offline
                                                                 (``wandb sync <run>/wandb/offline-run-*`` later)
swanlab        ``$SWANLAB_LOG_DIR`` else ``<run>/swanlog``        ``SWANLAB_MODE``; without it: online when
                                                                 ``SWANLAB_API_KEY`` is set, else offline
mlflow         ``$MLFLOW_TRACKING_URI`` else                     SQLite store (MLflow 3 refuses a plain folder
               ``sqlite:///<run>/mlflow.db``                     store); artifacts under ``<run>/mlflow-artifacts``
trackio        ``$TRACKIO_DIR`` else ``<run>/trackio``            local SQLite; ``trackio show`` reads it
clearml        ``$CLEARML_CACHE_DIR`` else ``<run>/clearml``      offline session unless ClearML credentials are set
                                                                 (``CLEARML_API_ACCESS_KEY`` or a clearml.conf)
=============  ==============================================  ====================================================

Validation samples (``trainer.log_val_generations``) go to each tracker's table where it has one (wandb, swanlab
echarts table, mlflow ``log_table``, clearml, trackio ``Table``), as text to TensorBoard.

Package and mode problems are found by :func:`check_trackers` at config validation, before any model loads.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from typing import Any

from npu_rl.utils.paths import check_output_dir

# logger name -> (import name, pip requirement)
PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "swanlab": ("swanlab", "swanlab"),
    "mlflow": ("mlflow", "mlflow-skinny sqlalchemy alembic"),
    "trackio": ("trackio", "trackio"),
    "clearml": ("clearml", "clearml"),
}
GENERATION_COLUMNS = ("step", "data_source", "prompt", "response", "score", "ground_truth")


def _set(env: dict[str, str] | None, key: str) -> bool:
    env = os.environ if env is None else env
    return bool(env.get(key))


def wandb_mode(env: dict[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("WANDB_MODE") or ("online" if env.get("WANDB_API_KEY") else "offline")


def swanlab_mode(env: dict[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("SWANLAB_MODE") or ("online" if env.get("SWANLAB_API_KEY") else "offline")  # "cloud" = online


def clearml_online(env: dict[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    if env.get("CLEARML_OFFLINE_MODE") in ("1", "true", "True"):
        return False
    if env.get("CLEARML_API_ACCESS_KEY") and env.get("CLEARML_API_SECRET_KEY"):
        return True
    conf = env.get("CLEARML_CONFIG_FILE") or os.path.expanduser("~/clearml.conf")
    return os.path.isfile(conf)


def check_trackers(loggers: list[str], env: dict[str, str] | None = None, interactive: bool | None = None
                   ) -> list[str]:
    """Problems that would stop a tracker after the models loaded: a missing package, an online mode that needs a
    login prompt (no TTY) or credentials that are not there. Empty when all is well."""
    env = os.environ if env is None else env
    interactive = sys.stdin.isatty() if interactive is None else interactive
    problems = []
    for name in loggers:
        if name not in PACKAGES:
            continue
        module, requirement = PACKAGES[name]
        if name == "tensorboard":
            ok = importlib.util.find_spec("tensorboard") is not None or importlib.util.find_spec("tensorboardX")
        else:
            ok = importlib.util.find_spec(module) is not None
        if not ok:
            problems.append(f"trainer.logger={name!r} needs the {module} package: pip install {requirement} "
                            "(or pip install 'npu-rl[trackers]')")
            continue
        if name == "wandb" and wandb_mode(env) == "online" and not env.get("WANDB_API_KEY") and not interactive:
            if not os.path.isfile(os.path.expanduser("~/.netrc")):
                problems.append("trainer.logger='wandb' with WANDB_MODE=online needs WANDB_API_KEY (no terminal to log "
                                "in from); set it, or WANDB_MODE=offline to sync later with `wandb sync`")
        if name == "swanlab":
            mode = swanlab_mode(env)
            if mode not in ("cloud", "online", "local", "offline", "disabled"):
                problems.append(f"SWANLAB_MODE={mode!r} is not one of online (cloud), local, offline, disabled")
            elif mode in ("cloud", "online") and not env.get("SWANLAB_API_KEY") and not interactive:
                problems.append(f"trainer.logger='swanlab' with SWANLAB_MODE={mode} needs SWANLAB_API_KEY (no terminal "
                                "to log in from); set it, or SWANLAB_MODE=offline (swanlab sync later)")
    return problems + tracker_folder_problems(loggers, env)


TRACKER_FOLDERS = {"tensorboard": "TENSORBOARD_DIR", "wandb": "WANDB_DIR", "mlflow": "MLFLOW_TRACKING_URI",
                   "trackio": "TRACKIO_DIR"}


def tracker_folder_problems(loggers: list[str], env: dict[str, str] | None = None) -> list[str]:
    """A chosen tracker's own folder (``TENSORBOARD_DIR``, ``WANDB_DIR``, an MLflow ``file:`` store, ``TRACKIO_DIR``)
    that cannot be written, found at validation instead of after the models loaded (trackio then lost the metrics
    with rc 0)."""
    from urllib.parse import urlparse


    env = os.environ if env is None else env
    problems = []
    for name in loggers:
        variable = TRACKER_FOLDERS.get(name)
        value = env.get(variable) if variable else None
        if not value:
            continue
        if name == "mlflow":
            parsed = urlparse(value)
            if parsed.scheme not in ("", "file"):
                continue  # a server: not a folder of ours to check
            value = parsed.path if parsed.scheme == "file" else value
        try:
            check_output_dir(value, variable)
        except (OSError, ValueError) as exc:
            problems.append(f"trainer.logger={name!r}: {exc}")
    return problems


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Nested config -> ``{"a.b.c": scalar}``; lists and None become strings (every tracker takes those)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        elif isinstance(v, (bool, int, float, str)):
            out[f"{prefix}{k}"] = v
        else:
            out[f"{prefix}{k}"] = str(v)
    return out


def _stdout_to_stderr():
    import contextlib

    return contextlib.redirect_stdout(sys.stderr)


_DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _accelerate_state() -> None:
    """accelerate's tracker classes log through accelerate's logger, which refuses to work before a ``PartialState``
    exists. The trackers live in the driver process only: make a single-process CPU state (distributed variables
    hidden while it is made, so it never joins or starts a process group, and no device is touched)."""
    from accelerate.state import PartialState

    if PartialState._shared_state:
        return
    saved = {k: os.environ.pop(k) for k in _DIST_VARS if k in os.environ}
    try:
        PartialState(cpu=True)
    finally:
        os.environ.update(saved)


class AccelerateBackend:
    """One of accelerate's trackers behind our ``log`` / ``log_generations`` / ``close``. It lives in the driver
    only, so accelerate's main-process gating is switched off."""

    name = ""

    def __init__(self, tracker, config: dict[str, Any]):
        _accelerate_state()
        self.tracker = tracker
        tracker.main_process_only = False
        with _stdout_to_stderr():  # trackers print banners ("Uploading logs ...") on stdout; stdout is for results
            tracker.start()
            if config:
                self.store_config(flatten(config))

    def store_config(self, values: dict[str, Any]) -> None:
        self.tracker.store_init_configuration(values)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.tracker.log(metrics, step=step)

    def log_generations(self, rows: list[dict[str, Any]], step: int) -> None:
        data = [[row.get(c) if c != "step" else step for c in GENERATION_COLUMNS] for row in rows]
        self.tracker.log_table("val/generations", columns=list(GENERATION_COLUMNS), data=data, step=step)

    def close(self) -> None:
        with _stdout_to_stderr():
            self.tracker.finish()


class TensorBoardBackend(AccelerateBackend):
    name = "tensorboard"

    def __init__(self, run_dir: str, experiment: str, config: dict[str, Any]):
        from accelerate.tracking import TensorBoardTracker

        self.log_dir = os.environ.get("TENSORBOARD_DIR") or os.path.join(run_dir, "tensorboard")
        parent, leaf = os.path.split(os.path.abspath(self.log_dir))
        super().__init__(TensorBoardTracker(leaf, parent), config)

    def store_config(self, values):
        # add_hparams writes a second event file in a timestamped sub-folder; the text of the config is enough
        self.tracker.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in sorted(values.items())), 0)

    def log_generations(self, rows, step):
        lines = [f"**{r.get('data_source', '')}** score {r.get('score')}\n\n    {r.get('prompt', '')}\n    -> "
                 f"{r.get('response', '')}" for r in rows]
        self.tracker.writer.add_text("val/generations", "\n\n---\n\n".join(lines), step)
        self.tracker.writer.flush()


class WandbBackend(AccelerateBackend):
    name = "wandb"

    def __init__(self, run_dir: str, project: str, experiment: str, config: dict[str, Any]):
        from accelerate.tracking import WandBTracker

        folder = os.environ.get("WANDB_DIR") or run_dir
        os.makedirs(folder, exist_ok=True)
        tracker = WandBTracker(project, name=experiment, dir=folder, mode=wandb_mode(), config=config,
                               settings={"console": "off", "silent": True})
        super().__init__(tracker, {})

    def log_generations(self, rows, step):
        import wandb

        data = [[step if c == "step" else row.get(c) for c in GENERATION_COLUMNS] for row in rows]
        self.tracker.run.log({"val/generations": wandb.Table(columns=list(GENERATION_COLUMNS), data=data)}, step=step)


class SwanlabBackend(AccelerateBackend):
    name = "swanlab"

    def __init__(self, run_dir: str, project: str, experiment: str, config: dict[str, Any]):
        from accelerate.tracking import SwanLabTracker

        logdir = os.environ.get("SWANLAB_LOG_DIR") or os.path.join(run_dir, "swanlog")
        tracker = SwanLabTracker(project, experiment_name=experiment, logdir=logdir, mode=swanlab_mode(),
                                 config=config)
        super().__init__(tracker, {})

    def log_generations(self, rows, step):
        import swanlab

        text = [swanlab.Text(f"[{r.get('data_source', '')}] score {r.get('score')}\n{r.get('prompt', '')}\n-> "
                             f"{r.get('response', '')}") for r in rows]
        self.tracker.log({"val/generations": text}, step=step)


class MlflowBackend(AccelerateBackend):
    name = "mlflow"

    def __init__(self, run_dir: str, project: str, experiment: str, config: dict[str, Any]):
        import mlflow
        from accelerate.tracking import MLflowTracker

        user_uri = os.environ.get("MLFLOW_TRACKING_URI")
        self.uri = user_uri or f"sqlite:///{os.path.join(run_dir, 'mlflow.db')}"
        artifacts = None if user_uri else os.path.join(run_dir, "mlflow-artifacts")
        os.makedirs(run_dir, exist_ok=True)
        for name in ("mlflow", "alembic"):  # "Creating initial MLflow database tables..." on every new store
            logging.getLogger(name).setLevel(logging.WARNING)
        mlflow.set_tracking_uri(self.uri)  # (also exports MLFLOW_TRACKING_URI: put back on close)
        self._user_uri = user_uri
        super().__init__(MLflowTracker(project, logging_dir=artifacts, run_name=experiment), config)

    def close(self):
        super().close()
        if self._user_uri is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)

    def log(self, metrics, step):
        # MLflow names allow letters, digits, _ - . space / : only
        self.tracker.log({k.replace("@", "_at_"): v for k, v in metrics.items()}, step=step)

    def log_generations(self, rows, step):
        import mlflow

        data = {c: [step if c == "step" else row.get(c) for row in rows] for c in GENERATION_COLUMNS}
        mlflow.log_table(data=data, artifact_file=f"val_generations/step_{step}.json")


class TrackioBackend(AccelerateBackend):
    name = "trackio"

    def __init__(self, run_dir: str, project: str, experiment: str, config: dict[str, Any]):
        if "trackio" not in sys.modules:  # trackio reads TRACKIO_DIR when imported
            os.environ.setdefault("TRACKIO_DIR", os.path.join(run_dir, "trackio"))
        elif not os.environ.get("TRACKIO_DIR"):
            logging.getLogger(__name__).warning("trackio was imported before the run started: it writes to its "
                                                "default folder, not %s", os.path.join(run_dir, "trackio"))
        from accelerate.tracking import TrackioTracker

        super().__init__(TrackioTracker(project, name=experiment, config=config), {})

    def log_generations(self, rows, step):
        import trackio

        data = [[step if c == "step" else row.get(c) for c in GENERATION_COLUMNS] for row in rows]
        self.tracker.run.log({"val/generations": trackio.Table(columns=list(GENERATION_COLUMNS), data=data)},
                             step=step)

    def close(self):
        import trackio

        with _stdout_to_stderr():  # trackio.finish also forgets the run, so its exit hook does not finish it again
            trackio.finish()


class ClearmlBackend(AccelerateBackend):
    name = "clearml"

    def __init__(self, run_dir: str, project: str, experiment: str, config: dict[str, Any]):
        if not clearml_online():
            os.environ.setdefault("CLEARML_CACHE_DIR", os.path.join(run_dir, "clearml"))
            from clearml import Task

            Task.set_offline(offline_mode=True)
        from accelerate.tracking import ClearMLTracker

        tracker = ClearMLTracker(experiment, project_name=project, task_name=experiment,
                                 auto_connect_frameworks=False, auto_resource_monitoring=False,
                                 auto_connect_streams=False, reuse_last_task_id=False)
        super().__init__(tracker, config)



def make_backend(name: str, run_dir: str, project: str, experiment: str, config: dict[str, Any]):
    if name == "tensorboard":
        return TensorBoardBackend(run_dir, experiment, config)
    classes = {"wandb": WandbBackend, "swanlab": SwanlabBackend, "mlflow": MlflowBackend,
               "trackio": TrackioBackend, "clearml": ClearmlBackend}
    return classes[name](run_dir, project, experiment, config)


# trainer.logger: the names npu_rl.tracking.Tracker builds (console and the metrics file here, the rest above)
LOGGERS: tuple[str, ...] = ("console", "file", "jsonl", *PACKAGES)
