"""Output folders checked before the work that fills them (a file in the way is found now, not after an hour)."""

from __future__ import annotations

import os
import tempfile


def check_output_dir(path: str, key: str, *, must_be_empty: bool = False) -> str:
    """``path`` can be created (or is a writable folder); raise ``NotADirectoryError`` / ``PermissionError`` naming
    ``key`` and the part of the path that is in the way. Leaves nothing behind: the deepest existing folder is
    tried by making (and removing) an empty folder in it, since permission bits do not tell (root passes
    ``os.access`` on ``/proc``, a read-only mount, a full quota)."""
    full = os.path.abspath(os.path.expanduser(str(path)))
    if os.path.exists(full) and not os.path.isdir(full):
        raise NotADirectoryError(f"{key}={path!r}: {full} is a file, not a folder")
    probe = full
    while not os.path.exists(probe):  # the deepest part that exists must be a writable folder
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise NotADirectoryError(f"{key}={path!r}: {probe} is a file, so no folder can be made under it")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise PermissionError(f"{key}={path!r}: {probe} is not writable")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".npu_rl_probe_", dir=probe))
    except OSError as exc:
        raise PermissionError(f"{key}={path!r}: nothing can be written in {probe} ({exc.strerror})") from None
    if must_be_empty and os.path.isdir(full) and os.listdir(full):
        raise FileExistsError(f"{key}={path!r}: {full} is not empty")
    return full


def check_output_file(path: str, key: str) -> str:
    """The folder of output file ``path`` can be made and written, and ``path`` itself is not a folder."""
    full = os.path.abspath(os.path.expanduser(str(path)))
    if os.path.isdir(full):
        raise IsADirectoryError(f"{key}={path!r}: {full} is a folder, not a file")
    check_output_dir(os.path.dirname(full) or ".", key)
    return full



def check_name_component(value: str, key: str) -> None:
    """A name that becomes part of a path (``trainer.experiment_name``): it may not climb out of the folder it is
    put in (a ``..`` part, or an absolute path)."""
    text = str(value)
    parts = text.replace("\\", "/").split("/")
    if text.startswith(("/", "~")) or ".." in parts or "\0" in text:
        raise ValueError(f"{key}={value!r} would put files outside the run folder (a '..' part or an absolute "
                         "path); use a plain name, e.g. with '-' or '_'")
