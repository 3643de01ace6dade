"""Entry point with verl's name: ``python -m npu_rl.trainer.main_ppo key=value ...``.

verl users change only the module (``verl.trainer.main_ppo`` -> ``npu_rl.trainer.main_ppo``); the keys are the same.
Flags: ``--config-name/-cn NAME`` (default ``ppo_trainer``; ``quickstart`` is the embedded default),
``--config-path/-cp DIR`` (your own YAML folder), ``--cfg job`` (print the resolved config, then validate it).
"""

from __future__ import annotations

import argparse
import errno
import sys
from typing import Callable

from npu_rl.agent.runner import AgentExitError
from npu_rl.config.loader import ConfigError, load_config, to_yaml
from npu_rl.trainer.arguments import parse_args
from npu_rl.trainer.preflight import check, load_checked, run_settings_for
from npu_rl.compat.verl.translate import translate_overrides
from npu_rl.config.key_docs import ignored_settings
from npu_rl.data.io import DataError
from npu_rl.plan.job import plan_config, this_device
from npu_rl.trainer.checkpoint import DiskFullError, disk_full_error
from npu_rl.trainer.interrupt import set_command
from npu_rl.trainer.ppo_trainer import NonFiniteLossError
from npu_rl.trainer.preflight import load_embedded_aware
from npu_rl.trainer.run import run
from npu_rl.utils.safe_load import CorruptFileError


def load_verl_config(overrides: list[str], config_name: str, config_path: str | None, notes: list[str]):
    """The config of a verl-style command line, unchecked: verl's keys translated (:mod:`npu_rl.compat.verl`), then
    loaded (``--cfg job`` prints it before the checks; ``npu-rl migrate`` reads it). Training goes through
    :func:`npu_rl.trainer.preflight.load_checked`, which translates the same way and checks everything."""
    return load_embedded_aware(translate_overrides(overrides, notes), config_name, config_path, notes)


def _notes(config, args: argparse.Namespace) -> list[str]:
    """Notes on keys with no effect that the user set: a config file we ship is the baseline, so its own values
    (chosen by us, not the user) never produce one; a user's own config folder is compared with the schema."""
    baseline = None
    if args.config_path is None:
        try:
            baseline = load_config([], args.config_name, None)
        except ConfigError:
            baseline = None
    return ignored_settings(config, baseline)


def memory_verdict(config) -> str:
    """``npu-rl plan``'s one line for this config on this machine's device (npu_rl/plan), or why there is none."""
    try:
        return plan_config(config, this_device()).verdict()
    except (ValueError, FileNotFoundError) as exc:
        return f"memory plan: not available ({exc})"


def main(argv: list[str] | None = None, default_config: str = "ppo_trainer",
         module: str = "npu_rl.trainer.main_ppo") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)

    prog = ["npu-rl", "train"] if default_config == "quickstart" else [sys.executable, "-m", module]
    set_command(prog + argv)
    args, unknown = parse_args(argv, default_config)
    flags = [u for u in unknown if u.startswith("-")]
    if flags:
        print(f"npu-rl: unknown option(s) {' '.join(flags)} (see --help)", file=sys.stderr)
        return 2
    overrides = args.overrides + unknown
    try:
        notes: list[str] = []
        if args.cfg:
            config = load_verl_config(overrides, args.config_name, args.config_path, notes)
            print(to_yaml(config))  # printed before the checks, so a config with problems can still be read
            check(config)
            notes += run_settings_for(config).notes
            for note in notes + _notes(config, args):
                print(f"# note: {note}", file=sys.stderr)
            print(f"# config {args.config_name!r} is valid", file=sys.stderr)
            print(f"# {memory_verdict(config)}", file=sys.stderr)
            return 0
        config = load_checked(overrides, args.config_name, args.config_path, notes=notes)
        for note in notes + _notes(config, args):
            print(f"npu-rl: note: {note}", file=sys.stderr)
    except ConfigError as exc:
        print(f"npu-rl: {exc}", file=sys.stderr)
        return 2

    print(f"npu-rl: config {args.config_name!r}" + (" (the embedded default; --config-name ppo_trainer gives verl's "
          "defaults)" if args.config_name == "quickstart" else ""), file=sys.stderr)


    entry = ["npu-rl", "train"] if default_config == "quickstart" else ["python", "-m", module]
    try:
        return run(config, entry + argv, checked=True)  # the command is recorded in the run folder
    except NonFiniteLossError as exc:  # said in words (which term, which key), not as a traceback
        print(f"npu-rl: error: {exc}", file=sys.stderr)
        return 1
    except DataError as exc:  # a data file that cannot be read, a row the data set refuses: file, column, row
        print(f"npu-rl: error: {exc}", file=sys.stderr)
        return 2
    except AgentExitError as exc:  # a user's agent loop, tool or interaction tried to end the process: named
        remote = getattr(exc, "cause", None)  # under Ray, a RayTaskError(AgentExitError): what the worker raised
        print(f"npu-rl: error: {remote if isinstance(remote, AgentExitError) else exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        full = exc if isinstance(exc, DiskFullError) else disk_full_error(exc, config.trainer.default_local_dir) \
            if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)) else None
        if full is None:
            raise
        print(f"npu-rl: error: {full.strerror}", file=sys.stderr)
        return 1
    except (CorruptFileError, ConfigError) as exc:  # a checkpoint that does not verify or asks to run code, a data
        print(f"npu-rl: {exc}", file=sys.stderr)     # row asking for what the config does not offer: said plainly
        return 2


def as_command(entry: Callable[[], int]) -> int:
    """``entry()``'s exit code, as ``python -m`` runs it: a second Ctrl-C (or the first one outside training) is exit
    code 130 and one line, as ``npu-rl`` says it (``npu_rl.cli``), not a ``KeyboardInterrupt`` traceback and 1."""
    try:
        return entry()
    except KeyboardInterrupt:
        print("npu-rl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(as_command(main))
