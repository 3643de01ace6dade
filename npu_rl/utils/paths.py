"""Output folders checked before the work that fills them (a file in the way is found now, not after an hour)."""

from __future__ import annotations

import os


def check_output_dir(path: str, key: str, *, must_be_empty: bool = False) -> str:
    """``path`` can be created (or is a writable folder); raise ``NotADirectoryError`` / ``PermissionError`` naming
    ``key`` and the part of the path that is in the way. Creates nothing."""
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



def current_umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def apply_umask(path: str) -> None:
    """Give ``path`` (and, for a folder, everything under it) the modes a plain ``open`` / ``mkdir`` would have under
    the user's umask. ``tempfile.mkstemp`` / ``mkdtemp`` create owner-only (0600 / 0700) files and folders, and a
    rename keeps those modes, so atomically written outputs need this to be shared like any other file."""
    mask = current_umask()
    file_mode, dir_mode = 0o666 & ~mask, 0o777 & ~mask
    if os.path.isdir(path):
        os.chmod(path, dir_mode)
        for root, dirs, files in os.walk(path):
            for name in dirs:
                os.chmod(os.path.join(root, name), dir_mode)
            for name in files:
                os.chmod(os.path.join(root, name), file_mode)
    else:
        os.chmod(path, file_mode)
