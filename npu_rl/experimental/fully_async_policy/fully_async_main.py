"""verl's ``verl.experimental.fully_async_policy.fully_async_main`` under npu-rl: the same keys, config
``fully_async_ppo_trainer``; a rollout pool streams samples into a bounded queue (docs/async.md)."""

from __future__ import annotations

import sys

from npu_rl.experimental import verl_flags
from npu_rl.trainer.main_ppo import as_command
from npu_rl.trainer.main_ppo import main as _main

MODULE = "npu_rl.experimental.fully_async_policy.fully_async_main"


def main(argv: list[str] | None = None) -> int:
    argv = verl_flags(list(sys.argv[1:] if argv is None else argv))
    return _main(argv + ["async_training.mode=fully_async"], default_config="fully_async_ppo_trainer",
                 module=MODULE)


if __name__ == "__main__":
    sys.exit(as_command(main))
