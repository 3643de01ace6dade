"""verl's experimental entry points, by the same module names: the asynchronous trainers (docs/async.md)."""

from __future__ import annotations

import os


def verl_flags(argv: list[str]) -> list[str]:
    """verl's async scripts pass ``--config-path=config --config-name='fully_async_ppo_trainer.yaml'``: the
    module's own config folder and a file name. Here the configs ship inside the package, so a ``config`` folder that
    does not exist in the working directory means ours, and the ``.yaml`` suffix is dropped."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg in ("--config-path", "-cp") and i + 1 < len(argv) and argv[i + 1] == "config" \
                and not os.path.isdir("config"):
            skip = True
            continue
        if arg == "--config-path=config" and not os.path.isdir("config"):
            continue
        if arg.startswith("--config-name=") and arg.endswith(".yaml"):
            arg = arg[: -len(".yaml")]
        out.append(arg)
    return out
