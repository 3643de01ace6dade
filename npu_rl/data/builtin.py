"""``builtin://`` data paths: data sets made in-process and cached as parquet, so a run needs no preprocessing step.

    builtin://arith/train                      the generated arithmetic task (defaults of ArithSpec)
    builtin://arith/test?max_digits=2&operators=+-&seed=3
    builtin://arith_tool/train                 3-digit multiplication with the calculator tool (npu_rl/data/tool_task.py)
    builtin://shapes/train?max_count=5&size=84 count the shapes in a generated picture (npu_rl/data/shapes.py; a
                                               vision-language task: images in verl's schema)
    builtin://gsm8k/train   builtin://gsm8k/test   builtin://math500/test   builtin://aime24/test

Query parameters set ArithSpec fields (``num_operands, operators, min_digits, max_digits, num_train, num_test,
seed``; ``digits=N`` sets both digit bounds); for ``shapes``, ShapesSpec fields (``min_count, max_count, size,
num_train, num_test, seed``). The local data sets are converted from the raw JSONL shipped in the package
(``npu_rl/data/sets``; ``$NPU_RL_DATA_DIR`` or a ``data_dir=`` query parameter point elsewhere). Files land in
``$NPU_RL_CACHE/datasets/<name>-<hash>/`` (default ``~/.cache/npu_rl``), keyed by a hash of the generator settings,
and are written atomically, so several processes resolving the same path at once are safe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from urllib.parse import parse_qsl, urlsplit

from npu_rl.data.arith import ArithSpec, generate_arith
from npu_rl.data.io import expand_path, write_parquet
from npu_rl.data.preprocess import CONVERTERS, convert, default_data_dir, find_raw_file
from npu_rl.data.shapes import ShapesSpec, generate_shapes
from npu_rl.data.tool_task import TOOL_TASK_DEFAULTS, generate_tool_task

SCHEME = "builtin://"
GENERATOR_VERSION = 1  # bump when the rows a spec produces change, so stale caches are not reused
_ARITH_INT_FIELDS = {"num_operands", "min_digits", "max_digits", "num_train", "num_test", "seed"}


def cache_dir() -> str:
    return expand_path(os.environ.get("NPU_RL_CACHE") or os.path.join("~", ".cache", "npu_rl"))


def is_builtin(path: object) -> bool:
    return isinstance(path, str) and path.startswith(SCHEME)


def _parse(uri: str) -> tuple[str, str, dict[str, str]]:
    parts = urlsplit(uri)
    name, split = parts.netloc, parts.path.strip("/")
    known = sorted(CONVERTERS) + ["arith", "arith_tool", "shapes"]
    if name not in known or not split:
        raise ValueError(f"unknown built-in data set {uri!r}; expected builtin://<name>/<split> with name in {known}")
    return name, split, dict(parse_qsl(parts.query, keep_blank_values=True))


def arith_spec_from_query(query: dict[str, str], uri: str = "", defaults: dict | None = None) -> ArithSpec:
    fields = {f.name for f in dataclasses.fields(ArithSpec)} - {"prompt_template"}
    kwargs: dict[str, object] = {}
    for key, value in query.items():
        if key == "digits":
            kwargs["min_digits"] = kwargs["max_digits"] = value
        elif key == "operators":
            kwargs[key] = value.replace(" ", "+")  # a bare '+' in a query string decodes to a space
        elif key in fields:
            kwargs[key] = value
        else:
            raise ValueError(f"{uri}: unknown arith parameter {key!r}; known: digits, {', '.join(sorted(fields))}")
    for key in list(kwargs):
        if key in _ARITH_INT_FIELDS:
            try:
                kwargs[key] = int(kwargs[key])  # type: ignore[arg-type]
            except ValueError as exc:
                raise ValueError(f"{uri}: arith parameter {key}={kwargs[key]!r} is not an integer") from exc
    return ArithSpec(**{**(defaults or {}), **kwargs})  # type: ignore[arg-type]


def shapes_spec_from_query(query: dict[str, str], uri: str = "") -> ShapesSpec:
    fields = {f.name for f in dataclasses.fields(ShapesSpec)}
    kwargs: dict[str, int] = {}
    for key, value in query.items():
        if key not in fields:
            raise ValueError(f"{uri}: unknown shapes parameter {key!r}; known: {', '.join(sorted(fields))}")
        try:
            kwargs[key] = int(value)
        except ValueError as exc:
            raise ValueError(f"{uri}: shapes parameter {key}={value!r} is not an integer") from exc
    return ShapesSpec(**kwargs)


def resolve_builtin(uri: str) -> str:
    """The local parquet path for a ``builtin://`` URI, generating (and caching) it when missing."""
    name, split, query = _parse(uri)
    if name == "arith":
        spec = arith_spec_from_query(query, uri)
        key = {"version": GENERATOR_VERSION, **spec.to_dict()}
        make = lambda: generate_arith(spec)  # noqa: E731
        splits = ("train", "test")
    elif name == "arith_tool":  # the calculator-tool task (npu_rl/data/tool_task.py)

        spec = arith_spec_from_query(query, uri, TOOL_TASK_DEFAULTS)
        key = {"version": GENERATOR_VERSION, "task": "arith_tool", **spec.to_dict()}
        make = lambda: generate_tool_task(spec)  # noqa: E731
        splits = ("train", "test")
    elif name == "shapes":  # the visual counting task (npu_rl/data/shapes.py)
        shapes = shapes_spec_from_query(query, uri)
        key = {"version": GENERATOR_VERSION, "task": "shapes", **shapes.to_dict()}
        make = lambda: generate_shapes(shapes)  # noqa: E731
        splits = ("train", "test")
    else:
        data_dir = expand_path(query.pop("data_dir", None) or default_data_dir())
        if query:
            raise ValueError(f"{uri}: {name} takes no parameters other than data_dir, got {sorted(query)}")
        splits = CONVERTERS[name][0]
        key = {"version": GENERATOR_VERSION, "data_dir": data_dir, "sources": _mtimes(data_dir, name, splits)}
        make = lambda: convert(name, data_dir)  # noqa: E731
    if split not in splits:
        raise ValueError(f"{uri}: {name} has splits {list(splits)}, not {split!r}")
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    folder = os.path.join(cache_dir(), "datasets", f"{name}-{digest}")
    path = os.path.join(folder, f"{split}.parquet")
    if not os.path.isfile(path):
        for split_name, rows in make().items():
            write_parquet(rows, os.path.join(folder, f"{split_name}.parquet"))
        with open(os.path.join(folder, "spec.json"), "w") as f:
            json.dump(key, f, indent=1, sort_keys=True)
    return path


def check_builtin(uri: str) -> None:
    """Fail (naming the URI) if ``resolve_builtin`` would, without generating anything: for the config validator."""
    name, split, query = _parse(uri)
    if name in ("arith", "arith_tool"):
        arith_spec_from_query(query, uri, TOOL_TASK_DEFAULTS if name == "arith_tool" else None).split_sizes()
        splits: tuple[str, ...] = ("train", "test")
    elif name == "shapes":
        shapes_spec_from_query(query, uri)
        splits = ("train", "test")
    else:
        data_dir = expand_path(query.pop("data_dir", None) or default_data_dir())
        if query:
            raise ValueError(f"{uri}: {name} takes no parameters other than data_dir, got {sorted(query)}")
        splits = CONVERTERS[name][0]
        if split in splits and find_raw_file(data_dir, name, split) is None:
            raw = os.path.join(data_dir, name, f"{split}.jsonl")
            raise FileNotFoundError(f"{uri}: the raw file {raw} (or .jsonl.xz / .jsonl.gz) does not exist "
                                    "(set NPU_RL_DATA_DIR or data_dir=)")
    if split not in splits:
        raise ValueError(f"{uri}: {name} has splits {list(splits)}, not {split!r}")


def _mtimes(data_dir: str, name: str, splits: tuple[str, ...]) -> dict[str, float]:
    # The raw files' modification times are part of the key, so an edited source is converted again.
    out = {}
    for split in splits:
        raw = find_raw_file(data_dir, name, split)
        out[split] = os.path.getmtime(raw) if raw else -1.0
    return out
