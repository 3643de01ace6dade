"""``npu-rl migrate SCRIPT.sh`` (or ``--overrides k=v ...`` / ``--overrides-file FILE``): what each of a verl run
script's overrides becomes in npu-rl, whether the result loads, and the equivalent npu-rl command.

The table and the command come from :mod:`npu_rl.compat.verl.migrate`; the script is read by
:mod:`npu_rl.compat.verl.script` (a restricted bash that runs no command but records the trainer call). Then the
kept overrides are loaded and checked with the code ``--cfg job`` runs (values always; paths and models unless
``--skip-paths``), so a value npu-rl refuses (``rollout.name=sglang``, ``adv_estimator=foo``) is named here, not at
the first run. Exit status: 0 when everything is accepted and checks, 1 when an override is refused or unknown or a
check fails, 2 on a usage error (no script, a script that cannot be read, no trainer call in it).
"""

from __future__ import annotations

import argparse
import os
import sys

from npu_rl.compat.verl import migrate as compat
from npu_rl.compat.verl.script import ScriptError, check_text, read_file, read_script
from npu_rl.config.errors import ConfigError
from npu_rl.trainer.main_ppo import load_verl_config
from npu_rl.trainer.preflight import check, run_folder_problems
from npu_rl.utils.redact import redact_text


def _usage(parser: argparse.ArgumentParser, message: str) -> int:
    parser.print_usage(sys.stderr)
    print(f"npu-rl migrate: {message}", file=sys.stderr)
    return 2


def _script_words(path: str, env_args: list[str]) -> tuple[list[str], list[str], str | None]:
    """(the trainer call's words, warnings, entry point); ScriptError / OSError where the script cannot be read."""
    text = check_text(read_file(path), path)
    # the variables the script would see: this shell's environment (secrets kept as $NAME), then --env
    env = {**os.environ, **dict(e.split("=", 1) for e in env_args if "=" in e)}
    reading = read_script(text, env)
    return reading.overrides, reading.warnings, reading.entry_point


def checks(overrides: list[str], flags: compat.Flags, check_paths: bool) -> tuple[list[str], list[str]]:
    """(value problems, path problems) of the kept overrides, by the loader's and ``--cfg job``'s own checks."""
    try:
        config = load_verl_config(overrides, flags.config_name, flags.config_path, [])
        check(config, check_paths=False, check_device=False)
    except ValueError as exc:  # ConfigError, or a registry's "unknown estimator" raised while loading
        return getattr(exc, "problems", [str(exc)]), []
    values = run_folder_problems(config)
    if not check_paths:
        return values, []
    try:
        check(config, check_paths=True, check_device=False)
    except ConfigError as exc:
        return values, [p for p in exc.problems if p not in values]  # (the run folder's are in values)
    return values, []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="npu-rl migrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("script", nargs="?", help="a verl run script (.sh); run in a restricted bash that runs no "
                                                  "command, only records the trainer call")
    parser.add_argument("--overrides", nargs="+", metavar="KEY=VALUE", help="overrides instead of a script")
    parser.add_argument("--overrides-file", help="a file with one override per line (# comments allowed)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a shell variable for reading the script (e.g. DEVICE=npu, MODEL_PATH=...)")
    parser.add_argument("--skip-paths", action="store_true",
                        help="check values only, not that the data files and model folders exist")
    args = parser.parse_args(argv)
    if sum([bool(args.script), bool(args.overrides), bool(args.overrides_file)]) != 1:
        return _usage(parser, "give exactly one of SCRIPT, --overrides or --overrides-file")
    warnings: list[str] = []
    if args.script:
        try:
            words, warnings, entry_point = _script_words(args.script, args.env)
        except (OSError, ScriptError) as exc:
            return _usage(parser, f"cannot read {args.script}: {exc}")
        if entry_point is None:
            return _usage(parser, f"{args.script}: no trainer call found (`python3 -m verl.trainer.main_ppo ...`)"
                          + "".join(f"\n  ({w})" for w in warnings))
        source = args.script
    elif args.overrides_file:
        try:
            with open(args.overrides_file, encoding="utf-8") as f:
                words = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
        except (OSError, UnicodeDecodeError) as exc:
            return _usage(parser, f"cannot read {args.overrides_file}: {exc}")
        source, entry_point = args.overrides_file, None
    else:
        words, source, entry_point = list(args.overrides), "overrides", None
    overrides, flags, flag_rows = compat.split_flags(words)
    flags.config_name = compat.entry_config_name(entry_point, flags.config_name)
    if entry_point is not None:
        flag_rows = compat.entry_point_rows(entry_point) + flag_rows
    if entry_point is not None and entry_point.endswith("main_dapo"):
        overrides, note = compat.dapo_entry_defaults(overrides)
        warnings.append(note)
    rows = flag_rows + compat.migrate(overrides)
    lines = compat.render(rows, source, warnings)
    mode = compat.npu_rl_module(entry_point)[1]  # an async trainer's module adds its mode, as npu-rl's does
    values, paths = checks(compat.kept_overrides(rows) + ([f"async_training.mode={mode}"] if mode else []), flags,
                           not args.skip_paths)
    lines.append("")
    if values or paths:
        lines.append("# the npu-rl command does not load as it is (the checks `--cfg job` runs):")
        lines += [f"check      {redact_text(p)}" for p in values] + [f"path       {redact_text(p)}" for p in paths]
    else:
        lines.append("# the kept overrides load and pass the checks of `--cfg job`"
                     + (" (values only: --skip-paths)" if args.skip_paths else ""))
    lines.append("")
    lines.append("# the equivalent npu-rl command:")
    lines += compat.command(rows, flags, entry_point)
    print("\n".join(lines))
    return 1 if values or paths or any(r.kind in compat.FAILING for r in rows) else 0
