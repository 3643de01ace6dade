"""``npu-rl convert``: a Megatron-core checkpoint (Megatron-LM / MindSpeed; ``torch_dist`` or the legacy
``mp_rank_*`` files, any tensor and pipeline parallel sizes) -> a Hugging Face folder that ``model.path`` loads.

    npu-rl convert /ckpt/qwen2.5-7b-grpo --out /models/qwen2.5-7b-grpo-hf --tokenizer Qwen/Qwen2.5-7B-Instruct

The architecture is read from the arguments Megatron-LM keeps in the checkpoint; the families converted are Qwen2 /
Qwen2.5, Qwen3, Llama and Qwen3-MoE (npu_rl/models/megatron.py has the name table and what is refused). Nothing in the
checkpoint's pickles runs. ``--out`` follows ``npu-rl merge``'s rules: a new or empty folder, or ``--force`` to
replace one that holds only model files.
"""

from __future__ import annotations

import argparse
import os
import sys

from npu_rl.commands.merge import check_merge_out, staged_output
from npu_rl.models.loader import load_tokenizer, resolve_model_path
from npu_rl.models.megatron import FAMILIES, MegatronCheckpointError, convert
from npu_rl.utils.dtypes import to_dtype
from npu_rl.utils.paths import check_output_dir
from npu_rl.utils.safe_load import CorruptFileError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="npu-rl convert", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="the checkpoint root (latest_checkpointed_iteration.txt) or an iter_* folder")
    parser.add_argument("--out", required=True, help="output folder (from_pretrained loads it)")
    parser.add_argument("--model-type", default=None, choices=FAMILIES,
                        help="the family (default: read from the checkpoint's arguments)")
    parser.add_argument("--tokenizer", default=None,
                        help="a tokenizer to save beside the weights (a folder or a Hub id), e.g. the base model's")
    parser.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp32"), help="cast weights (default: as saved)")
    parser.add_argument("--force", action="store_true", help="replace --out when it is not empty")
    args = parser.parse_args(argv)
    try:
        check_output_dir(args.out, "--out")
        source = os.path.abspath(os.path.expanduser(args.checkpoint))
        keep = (source,) if os.path.exists(source) else ()
        out = check_merge_out(args.out, args.force, keep, keep)
        tokenizer = load_tokenizer(resolve_model_path(args.tokenizer)) if args.tokenizer else None
        with staged_output(out, keep, keep) as staging:
            family, kind = convert(source, staging, family=args.model_type,
                                   dtype=to_dtype(args.dtype) if args.dtype else None, tokenizer=tokenizer)
    except (MegatronCheckpointError, CorruptFileError, FileNotFoundError, NotADirectoryError, FileExistsError,
            PermissionError, ValueError) as exc:
        print(f"npu-rl convert: {exc}", file=sys.stderr)
        return 2
    print(f"npu-rl convert: {source} ({kind}, {family}) -> {out}" +
          ("" if args.tokenizer else " (no tokenizer: pass --tokenizer, or copy the base model's tokenizer files)"))
    return 0
