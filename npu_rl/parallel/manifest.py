"""A checkpoint folder's manifest: every file's size and SHA-256, written when the save completes, checked at load.

``manifest.json``::

    {"format": "npu-rl-checkpoint", "version": 1, "files": {"model_optim/__0_0.distcp": {"size": ..., "sha256": ...}}}

What it gives: a file that is missing, truncated or altered since the save is named before anything reads it (a
corrupt ``.distcp`` or ``trainer_state.pt`` says which file), and a folder without a manifest is not taken for a
checkpoint. What it does not give: proof of who wrote it (anyone can write a manifest). Loading never runs code
whatever the manifest says; that is ``npu_rl.utils.safe_load``'s job.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Optional

from npu_rl.utils.safe_load import CorruptFileError

MANIFEST = "manifest.json"
FORMAT = "npu-rl-checkpoint"
VERSION = 1
_CHUNK = 8 << 20


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _files(folder: str) -> list[str]:
    """The regular files below ``folder``; symbolic links (to files or folders) are neither followed nor listed."""
    out = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(root, d)))
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(root, name), folder)
            if rel != MANIFEST and not name.endswith(".tmp") and not os.path.islink(os.path.join(root, name)):
                out.append(rel)
    return out


def write_manifest(folder: str, files: Optional[list[str]] = None) -> str:
    """Hash ``files`` (relative paths; default: every file below ``folder``) into ``folder/manifest.json``."""
    rels = list(files if files is not None else _files(folder))
    digests = _hash_all([os.path.join(folder, rel) for rel in rels])
    entries = {rel: {"size": os.path.getsize(os.path.join(folder, rel)), "sha256": digest}
               for rel, digest in zip(rels, digests)}
    out = os.path.join(folder, MANIFEST)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"format": FORMAT, "version": VERSION, "files": entries}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    return out


def read_manifest(folder: str) -> dict[str, dict]:
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        raise CorruptFileError(f"{folder} is not recognised as an npu-rl checkpoint: it has no {MANIFEST} (written "
                               "when a save completes; a folder from another tool, an interrupted save, or an npu-rl "
                               "older than the manifest)")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        files = data["files"]
        if data.get("format") != FORMAT or not isinstance(files, dict):
            raise ValueError(f"format {data.get('format')!r}")
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise CorruptFileError(f"{path} is not a valid npu-rl manifest ({type(exc).__name__}: {exc})") from None
    for rel in files:
        if os.path.isabs(rel) or ".." in rel.split(os.sep):
            raise CorruptFileError(f"{path} lists {rel!r}, outside its folder")
    return files


def verify_manifest(folder: str, deep: bool = True) -> dict[str, dict]:
    """Check every listed file's size (and hash when ``deep``); raise ``CorruptFileError`` naming the first bad
    file. Returns the listing."""
    files = read_manifest(folder)
    for rel, entry in files.items():
        path = os.path.join(folder, rel)
        if _through_link(folder, rel):
            raise CorruptFileError(f"{path} is (or lies under) a symbolic link: checkpoints are never read through "
                                   "links")
        if not os.path.isfile(path):
            raise CorruptFileError(f"{path} is missing (listed in {os.path.join(folder, MANIFEST)})")
        size = os.path.getsize(path)
        if size != entry.get("size"):
            raise CorruptFileError(f"{path} is corrupt: {size} bytes, the save wrote {entry.get('size')}")
    if deep:
        paths = [os.path.join(folder, rel) for rel in files]
        for path, digest, entry in zip(paths, _hash_all(paths), files.values()):
            if digest != entry.get("sha256"):
                raise CorruptFileError(f"{path} is corrupt: its SHA-256 differs from the one written at save")
    return files


def _through_link(folder: str, rel: str) -> bool:
    parts = rel.split(os.sep)
    return any(os.path.islink(os.path.join(folder, *parts[: i + 1])) for i in range(len(parts)))


def _hash_all(paths: list[str]) -> list[str]:
    """SHA-256 of each file, several files at once (hashlib releases the GIL: one core per file)."""
    if len(paths) < 2:
        return [file_sha256(p) for p in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1, len(paths))) as pool:
        return list(pool.map(file_sha256, paths))
