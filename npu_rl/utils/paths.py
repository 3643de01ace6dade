"""Output folders checked before the work that fills them (a file in the way is found now, not after an hour)."""

from __future__ import annotations

import fnmatch
import os
import pwd
import tempfile

# What a model folder (or a PEFT adapter folder) written by save_pretrained / npu-rl merge holds: a folder holding
# only these may be replaced whole; anything else in it (a dotfile, a sub-folder, notes) is somebody's and stays.
MODEL_FILE_PATTERNS = ("*.json", "*.safetensors", "*.bin", "*.model", "*.tiktoken", "*.jinja", "merges.txt",
                       "vocab.txt", "README.md")


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


def check_name_component(value: str, key: str) -> None:
    """A name that becomes part of a path (``trainer.experiment_name``): it may not climb out of the folder it is
    put in (a ``..`` part, or an absolute path)."""
    text = str(value)
    parts = text.replace("\\", "/").split("/")
    if text.startswith(("/", "~")) or ".." in parts or "\0" in text:
        raise ValueError(f"{key}={value!r} would put files outside the run folder (a '..' part or an absolute "
                         "path); use a plain name, e.g. with '-' or '_'")


def _home_folders() -> set[str]:
    homes = {os.path.expanduser("~"), os.environ.get("HOME") or "~"}
    try:
        homes.add(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:  # a uid without a passwd entry (containers)
        pass
    return {os.path.realpath(h) for h in homes if os.path.isabs(h)}


def _contains(folder: str, path: str) -> bool:
    """``path`` is ``folder`` or lies under it (both real paths)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def replace_problems(path: str, keep: tuple[str, ...] = (), within: tuple[str, ...] = ()) -> list[str]:
    """What replacing the existing folder ``path`` whole would delete that no command of ours made: the folder
    ``path`` is, or holds, a home folder, the working directory, a mount point, one of ``keep`` (the inputs being
    read), or files that are not a model's (the run's checkpoints, dotfiles, sub-folders, anything unlisted in
    ``MODEL_FILE_PATTERNS``); or it lies inside one of ``within`` (the folders whose files are read, e.g. the
    checkpoint being merged: a folder of a run folder is fine, one of the checkpoint is not). Empty when ``path``
    holds a model folder's files alone (a previous output)."""
    real = os.path.realpath(path)
    problems = []
    if os.path.ismount(real):
        problems.append(f"{real} is a mount point")
    homes = sorted(h for h in _home_folders() if _contains(real, h))
    if homes:
        problems.append(f"the home folder {', '.join(homes)}")
    if _contains(real, os.path.realpath(os.getcwd())):
        problems.append(f"the working directory {os.getcwd()}")
    for item in dict.fromkeys(keep + within):
        item_real = os.path.realpath(item)
        if _contains(real, item_real) or (item in within and _contains(item_real, real)):
            problems.append(f"the input {item}")
    names = sorted(os.listdir(real)) if os.path.isdir(real) else []
    runs = [n for n in names if n.startswith("global_step_") or n == "latest_checkpointed_iteration.txt"]
    if runs:
        problems.append(f"a run's checkpoints ({', '.join(runs[:5])}{' ...' if len(runs) > 5 else ''})")
    others = [n for n in names if n not in runs and not _model_file(os.path.join(real, n))]
    if others:
        problems.append(f"files that are not a model's ({', '.join(others[:5])}{' ...' if len(others) > 5 else ''}"
                        f"{f', {len(others)} in all' if len(others) > 5 else ''})")
    return problems


def _model_file(path: str) -> bool:
    name = os.path.basename(path)
    return (not os.path.islink(path) and os.path.isfile(path) and not name.startswith(".")
            and any(fnmatch.fnmatchcase(name, pattern) for pattern in MODEL_FILE_PATTERNS))


def check_replaceable(path: str, key: str, keep: tuple[str, ...] = (), within: tuple[str, ...] = ()) -> None:
    """Raise ``FileExistsError`` naming what would be deleted when the existing folder ``path`` may not be replaced
    whole (``replace_problems``)."""
    problems = replace_problems(path, keep, within)
    if problems:
        raise FileExistsError(f"{key} {path} will not be replaced: that would delete {'; '.join(problems)}. Give a "
                              "new folder, an empty one, or one holding only a previous output (model files)")
