"""The command line of ``npu-rl train`` / ``python -m npu_rl.trainer.main_ppo``, apart from the trainer so that
``npu-rl train --help`` answers without importing torch (npu_rl/cli.py)."""

from __future__ import annotations

import argparse


def parse_args(argv: list[str], default_config: str) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="npu-rl train",
        description="Run RL training. Overrides use verl's keys, e.g. actor_rollout_ref.actor.optim.lr=1e-6 "
                    "algorithm.adv_estimator=grpo preset=dapo.",
    )
    parser.add_argument("--config-name", "-cn", default=default_config,
                        help=f"YAML under configs/ (default: {default_config})")
    parser.add_argument("--config-path", "-cp", default=None, help="a folder of your own YAML configs")
    parser.add_argument("--cfg", choices=("job", "all"), default=None,
                        help="print the resolved config and check it, without training")
    parser.add_argument("overrides", nargs="*", help="key=value overrides (Hydra syntax)")
    return parser.parse_known_args(argv)


def asks_for_help(argv: list[str]) -> bool:
    return any(arg in ("-h", "--help") for arg in argv)
