"""``npu-rl merge CHECKPOINT --out DIR``: a (sharded) checkpoint -> a plain Hugging Face folder.

CHECKPOINT is a ``global_step_N`` folder (its ``actor/`` is merged; ``--role critic`` for the critic), a role
folder itself, or the run's ``default_local_dir`` (the latest step is taken). One process, no process group; host
memory for one full model.
"""

from __future__ import annotations

import argparse
import os
import sys


def resolve_checkpoint(path: str, role: str) -> str:
    from npu_rl.parallel.checkpoint import HF_DIR
    from npu_rl.trainer.checkpoint import latest_step, step_dir

    path = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(os.path.join(path, HF_DIR)):
        return path
    if os.path.isdir(os.path.join(path, role, HF_DIR)):
        return os.path.join(path, role)
    step = latest_step(path) if os.path.isdir(path) else None
    if step is not None:
        return os.path.join(step_dir(path, step), role)
    raise FileNotFoundError(f"{path} is not a checkpoint: expected a global_step_N folder, its {role}/ folder, or "
                            "a trainer.default_local_dir holding latest_checkpointed_iteration.txt")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="npu-rl merge", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="global_step_N folder, a role folder in it, or default_local_dir")
    parser.add_argument("--out", required=True, help="output folder (from_pretrained loads it)")
    parser.add_argument("--role", default="actor", choices=("actor", "critic"))
    parser.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp32"), help="cast weights (default: as saved)")
    args = parser.parse_args(argv)
    from npu_rl.models.loader import to_dtype
    from npu_rl.parallel.checkpoint import merge_checkpoint
    from npu_rl.utils.paths import check_output_dir
    from npu_rl.utils.safe_load import CorruptFileError

    try:
        check_output_dir(args.out, "--out")
        source = resolve_checkpoint(args.checkpoint, args.role)
        out = merge_checkpoint(source, args.out, dtype=to_dtype(args.dtype) if args.dtype else None)
    except (CorruptFileError, FileNotFoundError, NotADirectoryError, ValueError) as exc:
        print(f"npu-rl merge: {exc}", file=sys.stderr)
        return 2
    print(f"npu-rl merge: {source} -> {out}")
    return 0
