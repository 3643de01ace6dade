"""DCP's ``.metadata`` is unpickled resolving only what it is made of. Debian 12's Python 3.11.2 pickles an enum
member as ``getattr(EnumClass, name)``, so ``builtins.getattr`` is allowed, but only as ``getattr(<an allow-listed
enum class>, <one of its member names>)``; issue 39 found npu-rl refusing its own fresh checkpoint on that Python.

``data/dcp_metadata_enum_getattr.pickle`` is such a file (written by ``data/make_dcp_metadata_enum_getattr.py``
with a pickler that reduces enum members the way 3.11.2 does): it is read as stored, whatever Python runs the tests.
"""

from __future__ import annotations

import enum
import os
import pathlib
import pickle

import pytest
from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING, Metadata, TensorStorageMetadata

from npu_rl.parallel.checkpoint import MODEL_OPTIM_DIR, load_checkpoint, merge_checkpoint
from npu_rl.utils.safe_load import UnsafeFileError, restricted_unpickle
from tests.trainer.test_checkpoints import _model_and_optimizer, _rehash, _save_step

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "dcp_metadata_enum_getattr.pickle")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class _AsPython3112(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, enum.Enum):
            return getattr, (type(obj), obj.name)
        return NotImplemented


def test_the_stored_metadata_with_getattr_enum_members_is_read():
    with open(FIXTURE, "rb") as f:
        assert b"getattr" in f.read()  # the fixture is what it claims to be
    metadata = restricted_unpickle(FIXTURE)
    assert isinstance(metadata, Metadata)
    tensor = metadata.state_dict_metadata["model.model.embed_tokens.weight"]
    assert isinstance(tensor, TensorStorageMetadata) and tuple(tensor.size) == (128, 64)
    assert tensor.properties.memory_format is not None  # TensorProperties.__setstate__ decoded the enum member


def test_a_checkpoint_whose_metadata_uses_getattr_resumes_and_merges(tmp_path):
    path = _save_step(str(tmp_path / "run"), 1)
    actor = os.path.join(path, "actor")
    metadata_file = os.path.join(actor, MODEL_OPTIM_DIR, ".metadata")
    metadata = restricted_unpickle(metadata_file)
    with open(metadata_file, "wb") as f:
        _AsPython3112(f).dump(metadata)
    _rehash(path)
    model, optimizer = _model_and_optimizer(seed=5)
    assert load_checkpoint(actor, model, optimizer)["scheduler"] == {"last_epoch": 1}
    merge_checkpoint(actor, str(tmp_path / "merged"))


class _Reduce:
    def __init__(self, *reduced):
        self.reduced = reduced

    def __reduce__(self):
        return self.reduced


@pytest.mark.parametrize("payload, words", [
    (_Reduce(getattr, (pathlib.PosixPath, "unlink")), "getattr('PosixPath', 'unlink')"),
    (_Reduce(getattr, (_MEM_FORMAT_ENCODING, "__class__")), "getattr('_MEM_FORMAT_ENCODING', '__class__')"),
    (_Reduce(getattr, (Metadata, "__init__")), "getattr('Metadata', '__init__')"),
    (_Reduce(getattr, (_MEM_FORMAT_ENCODING, 3)), "getattr('_MEM_FORMAT_ENCODING', 3)"),
])
def test_any_other_getattr_is_refused(tmp_path, payload, words):
    crafted = tmp_path / ".metadata"
    crafted.write_bytes(pickle.dumps(payload))
    with pytest.raises(UnsafeFileError, match=r"was not loaded: it asks for " + words.replace("(", r"\(").replace(
            ")", r"\)")):
        restricted_unpickle(str(crafted))
