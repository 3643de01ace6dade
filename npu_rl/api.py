"""A Python way in, in the style TRL users know (``GRPOTrainer(model=..., reward_funcs=..., train_dataset=...)``)::

    from npu_rl import Trainer

    def exact(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        return float(solution_str.strip() == ground_truth)

    if __name__ == "__main__":   # the reward workers import this file to find `exact`: keep the run under the guard
        rows = [{"prompt": "1 + 1 =", "ground_truth": "2"}, ...]
        result = Trainer(model="Qwen/Qwen2.5-0.5B-Instruct", reward_funcs=[exact], train_dataset=rows).train()
        print(result.metrics["critic/score/mean"], result.checkpoint)

- ``model``: a local folder, a Hub id (``owner/name[@revision]``), a ModelScope id (``modelscope://owner/name``) or
  the embedded ``smollm2-135m-instruct``.
- ``reward_funcs``: callables or references (``path/to/file.py:name``, ``package.module:name``) with verl's
  signature ``fn(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float | dict``; several are
  summed (``reward_weights``, as TRL's). A function at the top level of a module or script is passed by reference
  (module and name, or the script's file and name); any other callable that pickles (a ``functools.partial``, a
  callable object, a bound method, a lambda or a function defined inside a function, with cloudpickle, which comes
  with Ray) is pickled when the ``Trainer`` is made, written under ``<output_dir>/reward_funcs/`` and loaded from
  there in every process that scores; one that does not pickle is refused there, naming it and why. ``None``: the
  rule scorers by ``data_source``.
- ``train_dataset`` / ``eval_dataset``: a ``datasets.Dataset``, a list of dicts, or a path (anything
  ``data.train_files`` takes). Rows need ``prompt`` (a string or chat messages) and a ground truth (``ground_truth``,
  ``answer`` or ``solution``, or verl's ``reward_model.ground_truth``); their other columns reach the reward function
  in ``extra_info``. Rows given in memory are written as parquet under ``<output_dir>/data``.
- ``config``: verl overrides (a list of ``key=value`` or a nested / dotted dict), or a ``PPOConfig`` (as
  ``npu_rl.config.loader.load_config`` returns it). Without one, ``config_name="quickstart"`` (GRPO, sized for one
  device) is the base; ``config_name="ppo_trainer"`` gives verl's defaults.

``train()`` returns the ``RunResult`` (exit code, steps, run folder, metrics file, the last checkpoint) with
``metrics`` (the last training step's row) and ``history`` (every row of metrics.jsonl).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import os
import pickle
import re
import sys
from typing import Any, Callable, Iterable, Optional, Sequence, Union

try:  # carries functions defined inside functions, lambdas and a script's own functions by value; comes with Ray
    import cloudpickle
except ImportError:  # pragma: no cover - then plain pickle: partials and callable objects of importable code
    cloudpickle = None

import npu_rl.reward.combined as combined
from npu_rl.config.schema import PPOConfig
from npu_rl.data.io import DataError, write_parquet
from npu_rl.data.modelscope_sets import parse_modelscope_data
from npu_rl.data.sources import DATA_SUFFIXES
from npu_rl.trainer.preflight import check, load_checked
from npu_rl.trainer.run import train

RewardFunc = Union[Callable[..., Any], str]
COMBINED_REWARD = "npu_rl.reward.combined"
_TRUTH_COLUMNS = ("ground_truth", "answer", "solution")


@dataclasses.dataclass(frozen=True)
class TrainResult:
    exit_code: int
    global_step: int
    run_dir: str
    metrics_path: str
    checkpoint: Optional[str]
    metrics: dict[str, Any]  # the last training step's metrics
    history: list[dict[str, Any]]  # every row of metrics.jsonl (training and validation)


# ---------------------------------------------------------------------------------------------- reward functions
@dataclasses.dataclass(frozen=True)
class PickledReward:
    """A reward callable that cannot be found again by module and name, pickled when the ``Trainer`` is made;
    written under ``<output_dir>/reward_funcs/`` (:func:`write_pickled`), whose file is then its reference."""

    label: str  # what the user gave, for messages and the metric name: 'partial(score)', 'Scorer object', ...
    data: bytes


def reward_reference(fn: RewardFunc) -> Union[str, PickledReward]:
    """``path/to/file.py:name`` or ``package.module:name`` for a reward function, or the callable pickled when it has
    no such name (:class:`PickledReward`); raises naming it when it is neither."""
    if isinstance(fn, str):
        source, sep, name = fn.rpartition(":")
        if source.endswith(".pkl") and not sep:
            source, sep, name = fn, ":", "pickled"
        if not sep or not source or not name:
            raise ValueError(f"reward function {fn!r}: expected 'path/to/file.py:name' or 'package.module:name'")
        if source.endswith((".py", ".pkl")):
            path = os.path.abspath(os.path.expanduser(source))
            if not os.path.isfile(path):
                raise FileNotFoundError(f"reward function {fn!r}: file {path} does not exist")
            return path if path.endswith(".pkl") else f"{path}:{name}"
        return fn
    if not callable(fn):
        raise TypeError(f"reward_funcs entries must be functions or 'file.py:name' strings, got {type(fn).__name__}")
    ref = _named_reference(fn)
    return ref if ref is not None else _pickled(fn)


def _named_reference(fn: Callable[..., Any]) -> Optional[str]:
    """``module:name`` or ``script.py:name`` when another process can import ``fn`` by name, else None."""
    qualname = getattr(fn, "__qualname__", None)
    if qualname is None or not isinstance(fn, type(_named_reference)):  # a partial, a callable object, a method
        return None
    if "<lambda>" in qualname or "<locals>" in qualname or "." in qualname:
        return None
    module = getattr(fn, "__module__", None)
    if module in (None, "__main__"):
        try:
            path = inspect.getsourcefile(fn)
        except TypeError:
            path = None
        if not path or not os.path.isfile(path):  # defined interactively: no file to import it from
            return None
        _check_main_guard(os.path.abspath(path), qualname)
        return f"{os.path.abspath(path)}:{qualname}"
    if getattr(sys.modules.get(module), qualname, None) is not fn:  # a decorated or replaced name
        return None
    return f"{module}:{qualname}"


def _label(fn: Callable[..., Any]) -> str:
    """The callable as the user knows it: 'partial(score)', 'Scorer object', 'make.<locals>.score', '<lambda>'."""
    if isinstance(fn, functools.partial):
        return f"partial({_label(fn.func)})"
    qualname = getattr(fn, "__qualname__", None)
    if qualname is not None:
        return qualname
    return f"{type(fn).__qualname__} object"


def _pickled(fn: Callable[..., Any]) -> PickledReward:
    """``fn`` pickled (and read back once, as every scoring process will), or a TypeError naming it and why."""
    label = _label(fn)
    dumps = cloudpickle.dumps if cloudpickle is not None else pickle.dumps
    try:
        data = dumps(fn)
        pickle.loads(data)
    except Exception as exc:  # noqa: BLE001 - whatever pickling raises is the reason given to the user
        hint = "" if cloudpickle is not None else (" (without cloudpickle, which comes with Ray, a function defined "
                                                   "inside a function or a lambda does not pickle)")
        raise TypeError(f"reward function {label!r} cannot be passed to the processes that score: it has no module "
                        f"and name to import it by, and pickling it failed: {type(exc).__name__}: {exc}{hint}. Define "
                        "it at the top level of a module or of your script, or leave out what it holds that does "
                        "not pickle") from exc
    return PickledReward(label, data)


def write_pickled(reward: PickledReward, out_dir: str, index: int) -> str:
    """Write a pickled reward under ``out_dir/reward_funcs/`` (its file names it); the path is its reference."""
    folder = os.path.join(out_dir, "reward_funcs")
    os.makedirs(folder, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.()-]+", "_", reward.label)[:80]
    path = os.path.join(folder, f"{index}-{name}.pkl")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(reward.data)
    os.replace(tmp, path)
    return path


def _check_main_guard(path: str, qualname: str) -> None:
    """Reward workers import the script to find the function: a training started at its top level would run again
    in every worker. Refuse that, naming the line."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError):
        return
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom, ast.If)):
            continue  # an `if` is the __main__ guard (or another condition the user chose)
        for call in ast.walk(node):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "train":
                raise RuntimeError(f"{path}:{node.lineno} starts training at the top level of the script that "
                                   f"defines reward function {qualname!r}; reward workers import that script, so put "
                                   "the run under `if __name__ == \"__main__\":`")


# --------------------------------------------------------------------------------------------------------- data
def _to_row(row: Any, index: int, what: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise TypeError(f"{what}: row {index} is a {type(row).__name__}, expected a dict")
    if "prompt" not in row:
        raise ValueError(f"{what}: row {index} has no 'prompt' (keys: {sorted(row)})")
    reward_model = dict(row.get("reward_model") or {})
    truth = reward_model.get("ground_truth")
    if truth is None:
        truth = next((row[c] for c in _TRUTH_COLUMNS if row.get(c) is not None), None)
    if truth is None:
        raise ValueError(f"{what}: row {index} has no ground truth; give 'ground_truth' (or 'answer' / "
                         "'solution'), which reaches the reward function as ground_truth")
    known = {"prompt", "data_source", "reward_model", "extra_info", "ability", *_TRUTH_COLUMNS}
    extra = {k: v for k, v in row.items() if k not in known}
    extra.update(row.get("extra_info") or {})
    extra.setdefault("index", index)
    return {"data_source": str(row.get("data_source", "npu_rl_api")), "prompt": row["prompt"],
            "ability": str(row.get("ability", "")),
            "reward_model": {"style": reward_model.get("style", "rule"), "ground_truth": truth}, "extra_info": extra}


def _looks_like_data_path(path: str) -> bool:
    """A path or URI ``data.*_files`` reads (it need not exist yet: validation says so, naming it)."""
    return (os.path.exists(os.path.expanduser(path)) or "://" in path
            or path.split("?")[0].lower().endswith(DATA_SUFFIXES + ("*",)) or parse_modelscope_data(path) is not None)


def _data_path(dataset: Any, out_dir: str, name: str) -> Union[str, list[str]]:
    """A path (or list of paths) as given, or rows written as parquet under ``out_dir``."""
    if isinstance(dataset, (str, os.PathLike)):
        return os.fspath(dataset)
    if isinstance(dataset, (list, tuple)) and dataset and all(isinstance(d, (str, os.PathLike)) for d in dataset):
        paths = [os.fspath(d) for d in dataset]
        stray = next((p for p in paths if not _looks_like_data_path(p)), None)
        if stray is not None:  # a list of prompts given as plain strings, read as file names
            raise TypeError(f"{name}: {stray!r:.80} is neither a file nor a data set path, and a list of strings is "
                            "read as data files; give rows as dicts with a 'prompt' and a 'ground_truth'")
        return paths
    if hasattr(dataset, "to_dict") and hasattr(dataset, "columns"):
        rows = dataset.to_dict("records")  # a pandas DataFrame (iterating one yields its column names)
    elif hasattr(dataset, "to_list") and callable(dataset.to_list):
        rows = dataset.to_list()  # datasets.Dataset
    elif isinstance(dataset, Iterable) and not isinstance(dataset, (dict, bytes)):
        rows = list(dataset)
    else:
        raise TypeError(f"{name}: expected a datasets.Dataset, a list of dicts or a path, got {type(dataset).__name__}")
    if not rows:
        raise ValueError(f"{name} is empty")

    try:
        return write_parquet([_to_row(r, i, name) for i, r in enumerate(rows)],
                             os.path.join(out_dir, "data", f"{name}.parquet"))
    except DataError as exc:  # the column in the verl schema: ground_truth / answer / solution -> reward_model.*,
        raise DataError(f"{name}: {exc} (your 'ground_truth' / 'answer' / 'solution' is reward_model.ground_truth "
                        "there, your other columns extra_info.<column>)") from exc


# ------------------------------------------------------------------------------------------------------- config
def _flatten(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value and not dotted.endswith(("reward_kwargs", "override_config")):
            out.update(_flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def _override(key: str, value: Any) -> str:
    return f"{key}={_hydra_value(value)}"


def _hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar (strings quoted, so paths with ':' or '/' stay strings)."""
    if isinstance(value, str):
        return _quoted(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    raise TypeError(f"config value {value!r} ({type(value).__name__}) cannot be written as an override")


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _as_overrides(config: Any) -> list[str]:
    if config is None:
        return []
    if isinstance(config, str):
        return [config]
    if isinstance(config, dict):
        return [_override(k, v) for k, v in _flatten(config).items()]
    if isinstance(config, Sequence):
        return [str(c) for c in config]
    raise TypeError(f"config: expected verl overrides (a list of key=value or a dict) or a PPOConfig, got "
                    f"{type(config).__name__}")


def _replace(config: Any, dotted: str, value: Any) -> Any:
    head, _, rest = dotted.partition(".")
    if not rest:
        return dataclasses.replace(config, **{head: value})
    return dataclasses.replace(config, **{head: _replace(getattr(config, head), rest, value)})


class Trainer:
    """RL post-training from Python (see the module docstring)."""

    def __init__(self, model: Optional[str] = None, reward_funcs: Union[RewardFunc, Sequence[RewardFunc], None] = None,
                 train_dataset: Any = None, eval_dataset: Any = None, config: Any = None, *,
                 reward_weights: Optional[Sequence[float]] = None, output_dir: Optional[str] = None,
                 config_name: str = "quickstart"):
        funcs = [] if reward_funcs is None else ([reward_funcs] if callable(reward_funcs) or
                                                 isinstance(reward_funcs, str) else list(reward_funcs))
        self.rewards = [reward_reference(f) for f in funcs]  # fail now, naming the function
        self.reward_refs: list[str] = []  # the references the config holds (pickled ones written under output_dir)
        if reward_weights is not None and len(reward_weights) != len(self.rewards):
            raise ValueError(f"reward_weights has {len(reward_weights)} entries for {len(self.rewards)} "
                             "reward_funcs")
        self.model, self.train_dataset, self.eval_dataset = model, train_dataset, eval_dataset
        self.reward_weights = None if reward_weights is None else [float(w) for w in reward_weights]
        self.output_dir, self.config_name, self.user_config = output_dir, config_name, config
        self.config = self._build_config()

    def _settings(self, out_dir: str) -> dict[str, Any]:
        """Our dotted keys -> values, from the arguments (the user's config gives everything else)."""
        settings: dict[str, Any] = {}
        if self.output_dir is not None:
            settings["trainer.default_local_dir"] = os.path.abspath(os.path.expanduser(self.output_dir))
        if self.model is not None:
            settings["actor_rollout_ref.model.path"] = str(self.model)
        if self.train_dataset is not None:
            settings["data.train_files"] = _data_path(self.train_dataset, out_dir, "train")
            if self.eval_dataset is None:  # nothing to validate on: no validation passes
                settings.update({"data.val_files": settings["data.train_files"], "trainer.val_before_train": False,
                                 "trainer.test_freq": -1})
        if self.eval_dataset is not None:
            settings["data.val_files"] = _data_path(self.eval_dataset, out_dir, "eval")
        self.reward_refs = [write_pickled(r, out_dir, i) if isinstance(r, PickledReward) else r
                            for i, r in enumerate(self.rewards)]
        if self.reward_refs:
            settings["custom_reward_function.path"] = combined.__file__
            settings["custom_reward_function.name"] = "compute_score"
            kwargs = {"reward_funcs": self.reward_refs}
            if self.reward_weights is not None:
                kwargs["reward_weights"] = self.reward_weights
            settings.update({f"custom_reward_function.reward_kwargs.{k}": v for k, v in kwargs.items()})
        return settings

    def _build_config(self):
        if isinstance(self.user_config, PPOConfig):
            base = self.user_config
            out_dir = os.path.abspath(os.path.expanduser(self.output_dir or base.trainer.default_local_dir))
            config = base
            settings = self._settings(out_dir)
            kwargs = {k.rpartition(".")[2]: settings.pop(k) for k in list(settings) if ".reward_kwargs." in k}
            if kwargs:
                settings["custom_reward_function.reward_kwargs"] = {**base.custom_reward_function.reward_kwargs,
                                                                    **kwargs}
            for key, value in settings.items():
                config = _replace(config, key, value)

            check(config)
            return config
        overrides = _as_overrides(self.user_config)

        probe = load_checked(overrides + ([_override("trainer.default_local_dir", os.path.abspath(
            os.path.expanduser(self.output_dir)))] if self.output_dir else []), self.config_name,
            check_paths=False, check_device=False)
        out_dir = os.path.abspath(os.path.expanduser(probe.trainer.default_local_dir))
        ours = [_override(k, v) for k, v in self._settings(out_dir).items()]
        return load_checked(overrides + ours, self.config_name)

    def train(self) -> TrainResult:
        result = train(self.config, ["npu_rl.Trainer", *self.reward_refs], checked=True)
        history: list[dict[str, Any]] = []
        if os.path.isfile(result.metrics_path):
            with open(result.metrics_path, encoding="utf-8") as f:
                history = [json.loads(line) for line in f if line.strip()]
        steps = [row for row in history if "actor/pg_loss" in row]
        return TrainResult(result.exit_code, result.global_step, result.run_dir, result.metrics_path,
                           result.checkpoint, steps[-1] if steps else {}, history)
