"""verl-recipe's ``recipe.prime.main_prime`` under npu-rl: ``python -m npu_rl.trainer.main_prime key=value ...``, the
same keys, config ``prime_trainer`` (configs/prime_trainer.yaml): PRIME's implicit process reward model trained in
every step, its token rewards, the group accuracy filter (docs/algorithms.md, "PRIME")."""

from __future__ import annotations

import sys

from npu_rl.trainer.main_ppo import as_command
from npu_rl.trainer.main_ppo import main as _main

MODULE = "npu_rl.trainer.main_prime"


def main(argv: list[str] | None = None) -> int:
    return _main(list(sys.argv[1:] if argv is None else argv), default_config="prime_trainer", module=MODULE)


if __name__ == "__main__":
    sys.exit(as_command(main))
