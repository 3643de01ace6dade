"""Loading files that someone else may have made, without running their code.

A pickle can call any function while it loads (``torch.load(..., weights_only=False)``, ``pickle.load``). So:

- Python state (the trainer state, each rank's scheduler / RNG state) is written by ``save_state`` as plain
  containers and tensors only: numpy arrays become a tagged byte tensor, tuples a tagged list. ``load_state`` reads it
  with ``torch.load(weights_only=True)``, whose unpickler builds nothing but tensors and containers, and turns the
  tags back. Anything else in the file is refused, naming the file.
- DCP's ``.metadata`` is a plain pickle of a few torch dataclasses: ``restricted_unpickle`` loads it with an
  unpickler that resolves only those classes (and dtypes, ``torch.Size``, paths) and refuses every other global.
- Another framework's ``torch.save`` files (Megatron-LM's ``model_optim_rng.pt`` / ``common.pt``):
  ``load_foreign_torch`` reads the archive itself, never through ``torch.load``, with an allow-list unpickler.

Errors are ``UnsafeFileError`` (the file asks for something outside the allow-list: crafted, or not ours) and
``CorruptFileError`` (unreadable or not in the expected shape), both naming the file.
"""

from __future__ import annotations

import enum
import io
import os
import pickle
from typing import Any

import numpy as np
import torch

STATE_FORMAT = "npu-rl-state/1"
_NUMPY_KINDS = "biufc"  # bool, int, uint, float, complex: never object arrays


class CorruptFileError(ValueError):
    """A checkpoint file is missing, truncated, or not what npu-rl wrote there; the message names it."""


class UnsafeFileError(CorruptFileError):
    """A file asks to run or import something that is not on the allow-list; it was not loaded."""


# --------------------------------------------------------------------------------------------- plain state
def encode(obj: Any, where: str = "state") -> Any:
    """``obj`` as dicts (str keys), lists, str, int, float, bool, None and tensors; raises naming the path of a
    value of any other type (so a state that could not be loaded safely is never written)."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in _NUMPY_KINDS:
            raise TypeError(f"{where}: a numpy array of dtype {obj.dtype} cannot be saved safely")
        raw = torch.frombuffer(bytearray(np.ascontiguousarray(obj).tobytes()), dtype=torch.uint8)
        return {"__ndarray__": raw, "dtype": obj.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return encode(obj.item(), where)
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: encode(v, f"{where}.{k}") for k, v in obj.items()}
        return {"__items__": [[encode(k, f"{where}<key>"), encode(v, f"{where}[{k!r}]")] for k, v in obj.items()]}
    raise TypeError(f"{where}: a {type(obj).__module__}.{type(obj).__qualname__} cannot be saved safely "
                    "(plain containers, numbers, strings, tensors and numpy arrays only)")


def decode(tree: Any, where: str = "state") -> Any:
    if isinstance(tree, list):
        return [decode(v, where) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if "__ndarray__" in tree:
        dtype = np.dtype(str(tree["dtype"]))
        if dtype.kind not in _NUMPY_KINDS:
            raise CorruptFileError(f"{where}: a numpy array of dtype {dtype} is not allowed")
        raw = tree["__ndarray__"]
        return np.frombuffer(raw.numpy().tobytes(), dtype=dtype).reshape([int(n) for n in tree["shape"]]).copy()
    if "__tuple__" in tree:
        return tuple(decode(v, where) for v in tree["__tuple__"])
    if "__items__" in tree:
        return {_hashable(decode(k, where)): decode(v, where) for k, v in tree["__items__"]}
    return {k: decode(v, where) for k, v in tree.items()}


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def save_state(obj: Any, path: str) -> None:
    """Write ``obj`` so that ``load_state`` can read it without running code (fsynced)."""
    payload = {"format": STATE_FORMAT, "state": encode(obj, os.path.basename(path))}
    with open(path, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())


def load_state(path: str) -> Any:
    """What ``save_state`` wrote. A file that needs more than tensors and containers to load is refused."""
    if not os.path.isfile(path):
        raise CorruptFileError(f"{path} does not exist")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights only" not in str(exc).lower() and "unsupported global" not in str(exc).lower():
            raise CorruptFileError(f"{path} is unreadable ({exc}); the file is corrupt or truncated") from None
        first_line = str(exc).splitlines()[0]
        raise UnsafeFileError(f"{path} was not loaded: it needs more than tensors and plain containers to load, so "
                              f"it was not written by this npu-rl (or was altered): {first_line}") from None
    except Exception as exc:  # truncated zip, bad magic number, ...
        raise CorruptFileError(f"{path} is unreadable ({type(exc).__name__}: {exc}); the file is corrupt or "
                               "truncated") from None
    if not isinstance(payload, dict) or payload.get("format") != STATE_FORMAT:
        raise CorruptFileError(f"{path} is not an npu-rl state file (format {STATE_FORMAT!r} expected)")
    return decode(payload["state"], path)


# --------------------------------------------------------------------------------------------- DCP metadata
def _allowed_globals() -> dict[tuple[str, str], Any]:
    import pathlib

    from torch.distributed.checkpoint import filesystem, metadata

    allowed: dict[tuple[str, str], Any] = {}
    for name in ("Metadata", "ChunkStorageMetadata", "TensorStorageMetadata", "BytesStorageMetadata",
                 "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"):
        if hasattr(metadata, name):
            allowed[("torch.distributed.checkpoint.metadata", name)] = getattr(metadata, name)
    allowed[("torch.distributed.checkpoint.filesystem", "_StorageInfo")] = filesystem._StorageInfo
    # megatron-core's torch_dist checkpoints keep the save plans in .metadata (plain dataclasses and an enum)
    from torch.distributed.checkpoint import planner

    for name in ("SavePlan", "WriteItem", "WriteItemType", "TensorWriteData"):
        if hasattr(planner, name):
            allowed[("torch.distributed.checkpoint.planner", name)] = getattr(planner, name)
    allowed[("torch", "Size")] = torch.Size
    for name in dir(torch):
        value = getattr(torch, name, None)
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
            allowed[("torch", name)] = value
    allowed[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
    for name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"):
        allowed[("pathlib", name)] = getattr(pathlib, name)
    allowed[("collections", "OrderedDict")] = __import__("collections").OrderedDict
    return allowed


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, path: str):
        super().__init__(file)
        self._path = path
        self._allowed = _allowed_globals()
        self._enums = {v for v in self._allowed.values() if isinstance(v, type) and issubclass(v, enum.Enum)}

    def _enum_member(self, owner: Any, name: Any) -> Any:
        """``getattr`` as the file may use it, and only so: ``getattr(<allow-listed enum class>, <member name>)``.
        Some Pythons pickle an enum member that way (Debian 12's 3.11.2: ``Enum.__reduce_ex__`` returns
        ``(getattr, (cls, name))``), others as ``cls(value)``; any other attribute of anything is refused."""
        if any(owner is e for e in self._enums) and isinstance(name, str) and name in owner.__members__:
            return owner.__members__[name]
        raise UnsafeFileError(f"{self._path} was not loaded: it asks for getattr({getattr(owner, '__name__', owner)!r}"
                              f", {name!r}), and a torch.distributed.checkpoint metadata file needs getattr only "
                              "for a member of one of its enums (a crafted or foreign file)")

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "getattr"):
            return self._enum_member
        value = self._allowed.get((module, name))
        if value is None:
            raise UnsafeFileError(f"{self._path} was not loaded: it asks for {module}.{name}, which a "
                                  "torch.distributed.checkpoint metadata file never needs (a crafted or foreign file)")
        return value


def restricted_unpickle(path: str) -> Any:
    """Load DCP's ``.metadata`` pickle, resolving only the classes it is made of."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise CorruptFileError(f"{path} is unreadable: {exc}") from None
    try:
        return _RestrictedUnpickler(io.BytesIO(data), path).load()
    except UnsafeFileError:
        raise
    except Exception as exc:
        raise CorruptFileError(f"{path} is corrupt ({type(exc).__name__}: {exc})") from None


# --------------------------------------------------------------------------------------------- foreign torch files
class Inert:
    """Stands for a class of another training framework named in a foreign checkpoint (an enum in Megatron-LM's
    ``args``, say): built from the file's arguments without importing or running anything; ``where`` names it."""

    def __init__(self, where: str, args: tuple = ()):
        self.where, self.args = where, args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<{self.where}{self.args!r}>"


def _inert_class(where: str):
    return lambda *args, **kwargs: Inert(where, args)


def _storage_dtypes() -> dict[str, torch.dtype]:
    """``FloatStorage`` -> torch.float32 ...: the typed-storage names a torch.save pickle refers to."""
    out = {}
    for name in dir(torch):
        if name.endswith("Storage") and name != "UntypedStorage":
            dtype = getattr(getattr(torch, name), "dtype", None)
            if isinstance(dtype, torch.dtype):
                out[name] = dtype
    return out


def load_foreign_torch(path: str, inert_prefixes: tuple[str, ...] = ()) -> Any:
    """A ``torch.save`` file another framework wrote (the zip format of torch >= 1.6), tensors on the CPU, read
    without ``torch.load``: its pickle is unpickled here with an allow-list (tensors, plain containers,
    ``argparse.Namespace``, dtypes, ``torch.Size``), any global under ``inert_prefixes`` (e.g. ``megatron.``: the
    enums of Megatron-LM's arguments) stands in as an :class:`Inert` without being imported, every other global is
    refused, and the tensor bytes come from the archive's ``data/<key>`` entries. ``UnsafeFileError`` /
    ``CorruptFileError`` name the file."""
    import argparse
    import collections
    import zipfile

    allowed = {("argparse", "Namespace"): argparse.Namespace, ("collections", "OrderedDict"): collections.OrderedDict,
               ("torch", "Size"): torch.Size, ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
               ("torch._utils", "_rebuild_parameter"): torch._utils._rebuild_parameter,
               ("builtins", "set"): set, ("builtins", "frozenset"): frozenset, ("builtins", "slice"): slice}
    for name in dir(torch):
        if isinstance(getattr(torch, name, None), torch.dtype):
            allowed[("torch", name)] = getattr(torch, name)
    storages = _storage_dtypes()
    if not os.path.isfile(path):
        raise CorruptFileError(f"{path} does not exist")
    try:
        archive = zipfile.ZipFile(path)
        names = archive.namelist()
        pickle_name = next((n for n in names if n.endswith("/data.pkl") or n == "data.pkl"), None)
        if pickle_name is None:
            raise CorruptFileError(f"{path} is not a torch.save archive (no data.pkl): a file of an older torch "
                                   "(before 1.6) or not a checkpoint")
        root = pickle_name[: -len("data.pkl")]
        if f"{root}byteorder" in names and archive.read(f"{root}byteorder").strip() not in (b"little", b""):
            raise CorruptFileError(f"{path} was saved on a big-endian machine; this reader takes little-endian files")
        loaded: dict[str, Any] = {}

        class Unpickler(pickle.Unpickler):
            def find_class(self, module: str, name: str) -> Any:
                if (module, name) in allowed:
                    return allowed[(module, name)]
                if module == "torch" and name in storages:
                    return storages[name]  # a storage type: only its dtype is used, in persistent_load
                if any(module == p.rstrip(".") or module.startswith(p) for p in inert_prefixes):
                    return lambda *args, **kwargs: Inert(f"{module}.{name}", args)
                raise UnsafeFileError(f"{path} was not loaded: it asks for {module}.{name}, which a checkpoint of "
                                      "tensors and settings never needs (a crafted file, or one this reader does "
                                      "not know)")

            def persistent_load(self, pid: Any) -> Any:
                if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                        and isinstance(pid[1], torch.dtype) and isinstance(pid[2], str)):
                    raise CorruptFileError(f"{path}: a storage reference {pid!r:.80} is not torch.save's")
                _, dtype, key, _, numel = pid
                if key not in loaded:
                    raw = archive.read(f"{root}data/{key}")
                    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
                    loaded[key] = torch.storage.TypedStorage(wrap_storage=data.untyped_storage(), dtype=dtype,
                                                             _internal=True)
                return loaded[key]

        return Unpickler(io.BytesIO(archive.read(pickle_name))).load()
    except (UnsafeFileError, CorruptFileError):
        raise
    except Exception as exc:
        raise CorruptFileError(f"{path} is unreadable ({type(exc).__name__}: {exc}); the file is corrupt or "
                               "truncated") from None
