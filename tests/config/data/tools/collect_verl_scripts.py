"""Regenerate tests/config/data/verl_scripts/: the override lists of verl's FSDP launches.

    python -m tests.config.data.tools.collect_verl_scripts VERL_CHECKOUT [VERL_RECIPE_CHECKOUT]

Each run script of verl's ``examples/`` and ``verl/experimental/*/shell`` (and of verl-recipe, the ``recipe``
submodule) is read as ``npu-rl migrate`` reads it (:mod:`npu_rl.compat.verl.script`: a restricted bash that runs no
command and records the trainer call) with ``MODEL_PATH=/models/MODEL`` and ``HOME=/home/user``. Launches of the
Megatron (or another non-FSDP) engine and commands that are not a trainer (SFT, generation, evaluation) are left out.
An existing file is kept as it is (its list was checked by hand). A launch of a trainer other than main_ppo gets a
``# trainer:`` line; one needing Hydra flags a ``# flags:`` line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from npu_rl.compat.verl.migrate import split_flags
from npu_rl.compat.verl.script import ENTRY_POINTS, ScriptError, check_text, read_script

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "verl_scripts")
ENV = {"MODEL_PATH": "/models/MODEL", "HOME": "/home/user"}
NOT_FSDP = re.compile(r"megatron|mcore|torchtitan|veomni|model_engine=(?!dp|fsdp)", re.IGNORECASE)
NOT_RL = re.compile(r"(^|/)(sft|generation|data_preprocess|tutorial|eval)(/|_)|main_generation|main_eval|model_merger")


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def collect(repo: str, name: str, prefixes: tuple[str, ...], rename, rev: str = "HEAD") -> dict[str, int]:
    commit = git(repo, "rev-parse", rev).strip()
    counts = {"read": 0, "written": 0, "kept": 0, "not fsdp": 0, "no trainer": 0}
    for path in git(repo, "ls-tree", "-r", "--name-only", commit).splitlines():
        if not path.endswith(".sh") or not path.startswith(prefixes) or NOT_RL.search(path):
            continue
        data = subprocess.run(["git", "-C", repo, "show", f"{commit}:{path}"], check=True, capture_output=True).stdout
        try:
            reading = read_script(check_text(data, path), dict(ENV))
        except ScriptError as exc:
            print(f"skip {path}: {exc}", file=sys.stderr)
            continue
        counts["read"] += 1
        if reading.entry_point is None:
            counts["no trainer"] += 1
            continue
        overrides, flags, _ = split_flags(reading.overrides)
        if NOT_FSDP.search(" ".join(reading.overrides)) or NOT_FSDP.search(flags.config_name) or NOT_FSDP.search(path):
            counts["not fsdp"] += 1
            continue
        target = os.path.join(OUT, rename(path) + ".txt")
        if os.path.exists(target):
            counts["kept"] += 1
            continue
        lines = [f"# source: {name}@{commit}:{path}",
                 "# the overrides it passes to the trainer, read by npu_rl.compat.verl.script "
                 "(MODEL_PATH=/models/MODEL, HOME=/home/user)"]
        if reading.entry_point not in ENTRY_POINTS:
            lines.append(f"# trainer: {reading.entry_point}")
        if flags.config_name != "ppo_trainer" or flags.config_path:
            lines.append(f"# flags: --config-name {flags.config_name}"
                         + (f" --config-path {flags.config_path}" if flags.config_path else ""))
        with open(target, "w", encoding="utf-8") as f:
            f.write("\n".join(lines + overrides) + "\n")
        counts["written"] += 1
    return counts


def main() -> None:
    verl = sys.argv[1]
    print("verl", collect(verl, "verl-project/verl", ("examples/", "verl/experimental/"),
                          lambda p: re.sub(r"^examples/", "", p)[:-3].replace("/shell/", "/").replace("/", "_")))
    if len(sys.argv) > 2:  # at the commit verl's recipe submodule points to
        pinned = git(verl, "ls-tree", "HEAD", "recipe").split()[2]
        print("verl-recipe", collect(sys.argv[2], "verl-project/verl-recipe", ("",),
                                     lambda p: "recipe_" + p[:-3].replace("/", "_"), pinned))


if __name__ == "__main__":
    main()
