"""``npu-rl``: train | eval | merge | convert | preprocess | doctor | plan | plot | bench.

Each sub-command's body lives with the code it drives; this file only routes. Its imports are the one place where
npu_rl's own modules are imported inside functions (the dispatch): ``npu-rl --help`` and ``npu-rl train --help``
import no torch, and ``npu-rl doctor`` works on a machine where half the stack is broken.
"""

from __future__ import annotations

import sys

USAGE = """usage: npu-rl <command> [args]

commands:
  train       RL training (GRPO/PPO/DAPO ...). No arguments: the embedded default (GRPO on arithmetic with
              SmolLM2-135M). verl overrides work: npu-rl train --config-name ppo_trainer data.train_files=...
  eval        accuracy / pass@k of a model folder or checkpoint on gsm8k | math500 | aime24 | arith
  merge       turn a (sharded) checkpoint into a plain Hugging Face folder
  convert     a Megatron-LM / MindSpeed checkpoint (torch_dist or mp_rank_*) -> a Hugging Face folder
  preprocess  write verl-schema parquet from local files: gsm8k | math500 | aime24 | arith | geo3k
  migrate     read a verl run script (runs none of its commands): what each override becomes here, checked,
              and the npu-rl command
  doctor      device, versions found and known-bad combinations; --parity MODEL: rollout vs actor log-probs
  plan        will a job fit: per-device memory of each phase, the peak, the keys that would make it fit
  plot        training curves (PNG + self-contained HTML) of one or several run folders
  bench       benchmarks: kernels | rollout | trainer | trl | moe

`npu-rl <command> --help` for a command's options; `npu-rl --version` the version."""


def _train(argv: list[str]) -> int:
    from npu_rl.trainer.arguments import asks_for_help, parse_args

    if asks_for_help(argv):  # answered here: the trainer's import brings torch
        parse_args(argv, "quickstart")
    from npu_rl.trainer.main_ppo import main

    return main(argv, default_config="quickstart")


def _eval(argv: list[str]) -> int:
    from npu_rl.commands.evaluate import main

    return main(argv)


def _merge(argv: list[str]) -> int:
    from npu_rl.commands.merge import main

    return main(argv)


def _convert(argv: list[str]) -> int:
    from npu_rl.commands.convert import main

    return main(argv)


def _preprocess(argv: list[str]) -> int:
    from npu_rl.data.preprocess import preprocess_main

    return preprocess_main(argv)


def _migrate(argv: list[str]) -> int:
    from npu_rl.commands.migrate import main

    return main(argv)


def _doctor(argv: list[str]) -> int:
    if any(a == "--parity" or a.startswith("--parity=") for a in argv):  # rollout vs actor log-probs
        from npu_rl.commands.parity import main as parity_main

        return parity_main(argv)
    from npu_rl.commands.doctor import main

    return main(argv)


def _plan(argv: list[str]) -> int:
    from npu_rl.commands.plan import main

    return main(argv)


def _plot(argv: list[str]) -> int:
    from npu_rl.tracking.plot import main

    return main(argv)


def _bench(argv: list[str]) -> int:
    targets = {
        "kernels": "npu_rl.commands.bench_kernels",
        "rollout": "npu_rl.commands.bench_rollout",
        "trainer": "npu_rl.commands.bench_trainer",
        "trl": "npu_rl.commands.bench_trl",
        "verl": "npu_rl.commands.bench_verl",
        "moe": "npu_rl.commands.bench_moe",
    }
    usage = (f"usage: npu-rl bench {{{'|'.join(targets)}}} [args]\n\n"
             "  kernels  fused log-prob / KL kernels against the plain reference (time, memory)\n"
             "  rollout  rollout engine throughput (tokens/s) on the chosen device\n"
             "  trainer  one training step's phases (padded vs packed, fused vs plain)\n"
             "  trl      TRL's GRPOTrainer and ours on the same task and sizes: wall and step times, their ratio\n"
             "  verl     verl's main_ppo and ours on the same GRPO job: s/step, tokens/s/GPU, phases, memory, ratio\n"
             "  moe      one mixture-of-experts block, forward + backward, with each experts implementation\n\n"
             "`npu-rl bench <target> --help` for a target's options.")
    if argv and argv[0] in ("-h", "--help"):
        print(usage)
        return 0
    if not argv or argv[0] not in targets:
        print(usage, file=sys.stderr)
        return 2
    import importlib

    return importlib.import_module(targets[argv[0]]).main(argv[1:])


COMMANDS = {
    "train": _train,
    "eval": _eval,
    "merge": _merge,
    "convert": _convert,
    "preprocess": _preprocess,
    "migrate": _migrate,
    "doctor": _doctor,
    "plan": _plan,
    "plot": _plot,
    "bench": _bench,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if argv[0] in ("--version", "-V", "version"):
        import npu_rl

        print(f"npu-rl {npu_rl.__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(command, COMMANDS, n=1)
        print(f"npu-rl: unknown command {command!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
              file=sys.stderr)
        print(USAGE, file=sys.stderr)
        return 2
    try:
        return int(COMMANDS[command](rest) or 0)
    except KeyboardInterrupt:  # a second Ctrl-C (training), or the first one elsewhere: no traceback
        print("npu-rl: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        if "Failed to load the backend extension: torch_npu" not in str(exc):
            raise
        # `import torch` loads torch_npu through its [torch.backends] entry point, and fails when CANN's
        # libraries cannot load: say what to do instead of a traceback from inside torch.
        print(f"npu-rl: {exc}\n  cause: {exc.__cause__!r}\n  torch_npu cannot load: source CANN's set_env.sh "
              "(source scripts/atlas/env.sh does), or run with TORCH_DEVICE_BACKEND_AUTOLOAD=0 DEVICE=cpu to use "
              "this machine without its NPUs", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
