"""``npu-rl merge CHECKPOINT --out DIR``: a (sharded) checkpoint -> a plain Hugging Face folder.

CHECKPOINT is a ``global_step_N`` folder (its ``actor/`` is merged; ``--role critic`` for the critic), a role
folder itself, or the run's ``default_local_dir`` (the latest step is taken). One process, no process group; host
memory for one full model.

A LoRA checkpoint (it holds ``lora_adapter/``) becomes the base model with the adapter merged into its weights
(the base is the adapter's ``base_model_name_or_path``, or ``--base``), or with ``--adapter-only`` the adapter
folder itself in PEFT format (``PeftModel.from_pretrained(base, DIR)`` loads it). ``--adapter ADAPTER`` with
CHECKPOINT a base model folder merges that adapter into it.

Every file read is first checked against the checkpoint's manifest (the adapter too). ``--out`` must be a new or an
empty folder (``--force`` replaces a folder holding model files alone, e.g. a previous merge, and never one that is
or holds a home folder, the working directory, a mount point, the checkpoint being merged, a run's checkpoints or
any other file: those are refused, naming what would have been deleted); the model is written into a temporary
folder beside it and moved into place only when complete, so an interrupted or failed merge never leaves a
half-written model, and a folder that holds another model is never written into.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile

from npu_rl.models.check import check_model_folder
from npu_rl.models.loader import load_tokenizer, resolve_model_path
from npu_rl.models.lora import merge_adapter, read_adapter_config
from npu_rl.parallel.checkpoint import HF_DIR, PROCESSOR_FILES, merge_checkpoint
from npu_rl.parallel.manifest import verify_manifest
from npu_rl.trainer.checkpoint import latest_step, step_dir
from npu_rl.utils.dtypes import to_dtype
from npu_rl.utils.paths import apply_umask, check_output_dir, check_replaceable
from npu_rl.utils.safe_load import CorruptFileError
from npu_rl.workers.checkpointing import LORA_ADAPTER_DIR


def resolve_checkpoint(path: str, role: str) -> str:
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
    parser.add_argument("--adapter-only", action="store_true", help="LoRA: write the adapter folder (PEFT format)")
    parser.add_argument("--base", default=None, help="LoRA: the base model (default: the adapter's recorded base)")
    parser.add_argument("--adapter", default=None, help="merge this PEFT adapter folder into the model CHECKPOINT")
    parser.add_argument("--force", action="store_true", help="replace --out when it is not empty")
    args = parser.parse_args(argv)

    dtype = to_dtype(args.dtype) if args.dtype else None
    try:
        check_output_dir(args.out, "--out")  # an unusable --out is said first, before the checkpoint is looked at
        source = args.checkpoint if args.adapter else resolve_checkpoint(args.checkpoint, args.role)
        read = tuple(p for p in (source, args.adapter, args.base) if p and os.path.exists(p))  # files read
        keep = tuple(p for p in (args.checkpoint,) if os.path.exists(p)) + read  # e.g. the run folder given
        out = check_merge_out(args.out, args.force, keep, read)
        with staged_output(out, keep, read) as staging:
            if args.adapter:
                merge_lora(args.checkpoint, args.adapter, staging, dtype)
            else:
                merge_source(source, staging, dtype, adapter_only=args.adapter_only, base=args.base)
    except (CorruptFileError, FileNotFoundError, NotADirectoryError, FileExistsError, PermissionError,
            ValueError) as exc:
        print(f"npu-rl merge: {exc}", file=sys.stderr)
        return 2
    print(f"npu-rl merge: {source} -> {out}")
    return 0


def check_merge_out(out: str, force: bool, keep: tuple[str, ...] = (), within: tuple[str, ...] = ()) -> str:
    """``--out``: a folder that can be made, and new or empty unless ``force``; an existing one is replaced whole,
    so it may hold only model files (``check_replaceable``), none of the inputs ``keep`` and lie in none of the
    folders read, ``within``."""
    full = check_output_dir(out, "--out")
    if os.path.isdir(full) and os.listdir(full) and not force:
        raise FileExistsError(f"--out {full} is not empty (it holds {', '.join(sorted(os.listdir(full))[:5])}"
                              f"{' ...' if len(os.listdir(full)) > 5 else ''}); give a new folder, or --force to "
                              "replace it")
    if os.path.isdir(full):
        check_replaceable(full, "--out", keep, within)
    return full


@contextlib.contextmanager
def staged_output(out: str, keep: tuple[str, ...] = (), within: tuple[str, ...] = ()):
    """A temporary folder beside ``out`` to write into; on success it replaces ``out`` (``out`` is removed first,
    only then, and only when ``check_replaceable`` still allows it), on failure it is removed and ``out`` is left as
    it was."""
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.merging-", dir=parent)
    try:
        yield staging
        apply_umask(staging)  # mkdtemp made it 0700: the merged model gets the user's umask like any folder
        if os.path.isdir(out):
            check_replaceable(out, "--out", keep, within)  # again: the merge took minutes, and the folder is not ours
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.replaced-", dir=parent)
            os.rename(out, os.path.join(old, "previous"))
            os.rename(staging, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def lora_adapter_dir(source: str) -> str | None:
    """The PEFT adapter folder of a LoRA checkpoint (None for a full-weight checkpoint)."""
    folder = os.path.join(source, LORA_ADAPTER_DIR)
    return folder if os.path.isdir(folder) else None


def merge_lora(base: str, adapter: str, out: str, dtype=None) -> str:
    """base model + PEFT adapter -> a merged HF folder (with the base's tokenizer, generation config and, for a
    vision-language base, its image processor files)."""
    check_model_folder(base, "the base model")  # the trainer's checks and words, before anything loads
    merge_adapter(base, adapter, out, dtype=dtype, tokenizer=load_tokenizer(base))
    for name in ("generation_config.json",) + PROCESSOR_FILES:
        path = os.path.join(resolve_model_path(base), name)
        if os.path.isfile(path):
            shutil.copyfile(path, os.path.join(out, name))
    return out


def merge_source(source: str, out: str, dtype=None, *, adapter_only: bool = False, base: str | None = None) -> str:
    """A resolved checkpoint folder -> ``out``: full weights merged from shards, or for LoRA the adapter merged
    into its base (or, ``adapter_only``, the adapter folder copied)."""
    adapter = lora_adapter_dir(source)
    if adapter is not None:
        listed = verify_manifest(source)  # the adapter as saved, before it is read (merge_checkpoint: the shards)
        missing = [name for name in os.listdir(adapter) if f"lora_adapter/{name}" not in listed]
        if missing:
            raise CorruptFileError(f"{adapter}: {', '.join(sorted(missing))} not listed in {source}/manifest.json, "
                                   "so a changed adapter could not be detected (a checkpoint from an older npu-rl); "
                                   f"merge it explicitly: npu-rl merge <base model> --adapter {adapter} --out DIR")
    if adapter is None:
        if adapter_only or base:
            raise ValueError(f"{source} is not a LoRA checkpoint (no lora_adapter/): --adapter-only / --base apply "
                             "to LoRA checkpoints only")
        return merge_checkpoint(source, out, dtype=dtype)
    if adapter_only:
        shutil.copytree(adapter, out, dirs_exist_ok=True)
        return out

    base = base or read_adapter_config(adapter).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{adapter}: adapter_config.json records no base_model_name_or_path; pass --base")
    return merge_lora(base, adapter, out, dtype)
