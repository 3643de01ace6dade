"""verl's ``verl.experimental.one_step_off_policy.main_ppo`` under npu-rl: the same keys, config
``one_step_off_ppo_trainer``; the rollout of step k+1 overlaps the update on step k (docs/async.md)."""

from __future__ import annotations

import sys

from npu_rl.experimental import verl_flags
from npu_rl.trainer.main_ppo import as_command
from npu_rl.trainer.main_ppo import main as _main

MODULE = "npu_rl.experimental.one_step_off_policy.main_ppo"


def main(argv: list[str] | None = None) -> int:
    argv = verl_flags(list(sys.argv[1:] if argv is None else argv))
    return _main(argv + ["async_training.mode=one_step_off"], default_config="one_step_off_ppo_trainer",
                 module=MODULE)


if __name__ == "__main__":
    sys.exit(as_command(main))
