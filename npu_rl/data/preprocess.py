"""``npu-rl preprocess gsm8k|math500|aime24|arith|geo3k``: local files -> verl's parquet schema (never downloads).

Each converter mirrors verl's ``examples/data_preprocess`` scripts so that parquet files made here and there are
interchangeable: the same ``data_source`` names (which pick the reward scorer), the same instruction appended to
the question, ``reward_model.ground_truth`` the bare final answer, ``extra_info.{split, index}`` plus the raw text.

The raw JSONL is read from ``--data-dir``, else ``$NPU_RL_DATA_DIR``, else the copies shipped inside the package
(``npu_rl/data/sets/``, xz-compressed, licences and sources in its README.md). A folder holds
``gsm8k/{train,test}.jsonl``, ``math500/test.jsonl``, ``aime24/test.jsonl``; each may also be ``.jsonl.xz`` / ``.jsonl.gz``.

``geo3k`` (images; docs/vl.md) reads a local copy of the Hub data set ``hiyouga/geometry3k`` given as ``--data-dir``
(its ``data/<split>-*.parquet`` files, or ``<split>.parquet`` / ``<split>-*.parquet`` in the folder): nothing of it
ships here. Its rows keep the images as they are (``{"bytes", "path"}``), as verl's geo3k script does.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
from typing import Any, Callable

from npu_rl.data.arith import ArithSpec, generate_arith
from npu_rl.data.io import expand_path, read_jsonl, read_rows, write_parquet
from npu_rl.utils.paths import check_output_dir

GSM8K_DATA_SOURCE = "openai/gsm8k"
MATH500_DATA_SOURCE = "HuggingFaceH4/MATH-500"
AIME24_DATA_SOURCE = "aime2024"  # verl dispatches every data_source starting with "aime" to its math_dapo scorer
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
BOXED_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."

_GSM8K_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


PACKAGED_DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sets")
RAW_SUFFIXES = (".jsonl", ".jsonl.xz", ".jsonl.gz")


def default_data_dir() -> str:
    """``$NPU_RL_DATA_DIR``, else the data sets shipped in the package (``npu_rl/data/sets``)."""
    if os.environ.get("NPU_RL_DATA_DIR"):
        return expand_path(os.environ["NPU_RL_DATA_DIR"])
    return PACKAGED_DATA_DIR


def find_raw_file(data_dir: str, dataset: str, split: str) -> str | None:
    """``<data_dir>/<dataset>/<split>.jsonl`` or its ``.xz`` / ``.gz`` copy, whichever exists first; else None."""
    for suffix in RAW_SUFFIXES:
        path = os.path.join(expand_path(data_dir), dataset, split + suffix)
        if os.path.isfile(path):
            return path
    return None


def _raw_file(data_dir: str, dataset: str, split: str) -> str:
    path = find_raw_file(data_dir, dataset, split)
    if path is None:
        raise FileNotFoundError(
            f"{os.path.join(expand_path(data_dir), dataset, split + '.jsonl')} not found (nor .jsonl.xz / .jsonl.gz): "
            f"npu-rl never downloads data; put the {dataset} JSONL there, or pass --data-dir / set NPU_RL_DATA_DIR "
            "to the folder that holds it (without either, the copies shipped in the package are used)"
        )
    return path


def _field(row: dict[str, Any], key: str, path: str, index: int) -> Any:
    if key not in row or row[key] in (None, ""):
        raise ValueError(f"{path}: row {index} has no {key!r} (keys: {sorted(row)})")
    return row[key]


def gsm8k_answer(solution: str) -> str:
    """The number after ``####`` in a GSM8K reference solution, commas removed (verl's extract_solution)."""
    match = _GSM8K_ANSWER.search(solution)
    if match is None:
        raise ValueError(f"no '#### <number>' in GSM8K solution {solution[-80:]!r}")
    return match.group(1).replace(",", "")


def gsm8k_rows(data_dir: str, split: str) -> list[dict[str, Any]]:
    path = _raw_file(data_dir, "gsm8k", split)
    rows = []
    for i, raw in enumerate(read_jsonl(path)):
        question, answer = _field(raw, "question", path, i), _field(raw, "answer", path, i)
        try:
            ground_truth = gsm8k_answer(answer)
        except ValueError as exc:
            raise ValueError(f"{path}: row {i}: {exc}") from exc
        rows.append({
            "data_source": GSM8K_DATA_SOURCE,
            "prompt": [{"role": "user", "content": question + " " + GSM8K_INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": ground_truth},
            "extra_info": {"split": split, "index": i, "answer": answer, "question": question},
        })
    return rows


def math500_rows(data_dir: str, split: str = "test") -> list[dict[str, Any]]:
    path = _raw_file(data_dir, "math500", split)
    rows = []
    for i, raw in enumerate(read_jsonl(path)):
        problem, answer = _field(raw, "problem", path, i), _field(raw, "answer", path, i)
        rows.append({
            "data_source": MATH500_DATA_SOURCE,
            "prompt": [{"role": "user", "content": problem + " " + BOXED_INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(answer)},
            "extra_info": {
                "split": split, "index": i, "question": problem, "solution": raw.get("solution", ""),
                "subject": raw.get("subject", ""), "level": int(raw.get("level") or 0),
                "unique_id": raw.get("unique_id", ""),
            },
        })
    return rows


def aime24_rows(data_dir: str, split: str = "test") -> list[dict[str, Any]]:
    path = _raw_file(data_dir, "aime24", split)
    rows = []
    for i, raw in enumerate(read_jsonl(path)):
        problem, answer = _field(raw, "problem", path, i), _field(raw, "answer", path, i)
        try:
            ground_truth = str(int(str(answer).strip()))  # "025" -> "25", as verl's AIME preparation does
        except ValueError as exc:
            raise ValueError(f"{path}: row {i}: AIME answer {answer!r} is not an integer") from exc
        rows.append({
            "data_source": AIME24_DATA_SOURCE,
            "prompt": [{"role": "user", "content": problem + "\n\n" + BOXED_INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": ground_truth},
            "extra_info": {"split": split, "index": i, "id": raw.get("id"), "url": raw.get("url", ""),
                           "question": problem},
        })
    return rows


GEO3K_DATA_SOURCE = "hiyouga/geometry3k"
GEO3K_INSTRUCTION = (r"You FIRST think about the reasoning process as an internal monologue and then provide the final "
                     r"answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer "
                     r"MUST BE put in \boxed{}.")  # verl's examples/data_preprocess/geo3k.py, word for word


def _geo3k_files(data_dir: str, split: str) -> list[str]:
    folder = expand_path(data_dir)
    for pattern in (f"data/{split}-*.parquet", f"{split}-*.parquet", f"{split}.parquet", f"geo3k/{split}.parquet"):
        files = sorted(glob.glob(os.path.join(folder, pattern)))
        if files:
            return files
    raise FileNotFoundError(f"{folder}: no {split} parquet of hiyouga/geometry3k (looked for data/{split}-*.parquet, "
                            f"{split}-*.parquet, {split}.parquet); npu-rl never downloads data: give --data-dir the "
                            "folder of a local copy (huggingface-cli download hiyouga/geometry3k --repo-type dataset)")


def geo3k_rows(data_dir: str, split: str) -> list[dict[str, Any]]:
    """verl's geo3k rows: the problem + the instruction as the user message, the images kept, the answer as ground
    truth."""
    rows = []
    for path in _geo3k_files(data_dir, split):
        for i, raw in enumerate(read_rows(path)):
            problem, answer = _field(raw, "problem", path, i), _field(raw, "answer", path, i)
            rows.append({
                "data_source": GEO3K_DATA_SOURCE,
                "prompt": [{"role": "user", "content": problem + " " + GEO3K_INSTRUCTION}],
                "images": list(raw.get("images") if raw.get("images") is not None else []),
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": len(rows), "answer": answer, "question": problem},
            })
    return rows


def geo3k_splits(data_dir: str | None) -> dict[str, list[dict[str, Any]]]:
    if not data_dir:
        raise ValueError("geo3k: give --data-dir, the folder of a local copy of hiyouga/geometry3k (npu-rl never "
                         "downloads data)")
    return {split: geo3k_rows(data_dir, split) for split in ("train", "test")}


# dataset -> (splits it has, converter)
CONVERTERS: dict[str, tuple[tuple[str, ...], Callable[[str, str], list[dict[str, Any]]]]] = {
    "gsm8k": (("train", "test"), gsm8k_rows),
    "math500": (("test",), math500_rows),
    "aime24": (("test",), aime24_rows),
}


def convert(dataset: str, data_dir: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """``{split: rows}`` for one of CONVERTERS."""
    if dataset not in CONVERTERS:
        raise ValueError(f"unknown dataset {dataset!r}; known: {', '.join(sorted(CONVERTERS))}, arith")
    splits, fn = CONVERTERS[dataset]
    data_dir = data_dir or default_data_dir()
    return {split: fn(data_dir, split) for split in splits}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npu-rl preprocess",
        description="Write verl-schema parquet files (train.parquet / test.parquet) from local JSONL; never downloads.",
    )
    parser.add_argument("dataset", choices=sorted(CONVERTERS) + ["arith", "geo3k"])
    parser.add_argument("--data-dir", default=None,
                        help="folder holding gsm8k/, math500/, aime24/ (default: $NPU_RL_DATA_DIR, else the copies "
                             "shipped in the package)")
    parser.add_argument("--output-dir", "--local_save_dir", dest="output_dir", default=None,
                        help="where to write the parquet files (default: ~/data/<dataset>)")
    arith = parser.add_argument_group("arith options")
    defaults = ArithSpec()
    arith.add_argument("--num-operands", type=int, default=defaults.num_operands)
    arith.add_argument("--operators", default=defaults.operators, help="operators to draw from, e.g. '+-*'")
    arith.add_argument("--min-digits", type=int, default=defaults.min_digits)
    arith.add_argument("--max-digits", type=int, default=defaults.max_digits)
    arith.add_argument("--num-train", type=int, default=defaults.num_train)
    arith.add_argument("--num-test", type=int, default=defaults.num_test)
    arith.add_argument("--seed", type=int, default=defaults.seed)
    return parser


def preprocess_main(argv: list[str]) -> int:
    """The body of ``npu-rl preprocess``; returns the exit status."""
    args = _parser().parse_args(argv)

    try:
        output_dir = expand_path(args.output_dir or os.path.join("~", "data", args.dataset))
        check_output_dir(output_dir, "--output-dir")  # before the conversion, not after it
        if args.dataset == "arith":
            spec = ArithSpec(num_operands=args.num_operands, operators=args.operators, min_digits=args.min_digits,
                             max_digits=args.max_digits, num_train=args.num_train, num_test=args.num_test,
                             seed=args.seed)
            splits = generate_arith(spec)
        elif args.dataset == "geo3k":
            splits = geo3k_splits(args.data_dir)
        else:
            splits = convert(args.dataset, args.data_dir)
        for split, rows in splits.items():
            path = write_parquet(rows, os.path.join(output_dir, f"{split}.parquet"))
            print(f"{args.dataset} {split}: {len(rows)} rows -> {path}")
    except (ValueError, OSError) as exc:
        print(f"npu-rl preprocess: error: {exc}", file=sys.stderr)
        return 2
    return 0
