"""Writes the fixture named on the command line (tests/utils/data/dcp_metadata_enum_getattr.pickle): the DCP
.metadata of a tiny model + AdamW, pickled the way Debian 12's Python 3.11.2 pickles enum members
(``getattr(cls, name)``). Run: python tests/utils/data/make_dcp_metadata_enum_getattr.py OUT."""
import enum, os, pickle, sys, tempfile
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from tests.trainer.test_checkpoints import _model_and_optimizer
from npu_rl.utils.safe_load import restricted_unpickle

class Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, enum.Enum):
            return getattr, (type(obj), obj.name)
        return NotImplemented

with tempfile.TemporaryDirectory() as d:
    model, optimizer = _model_and_optimizer()
    msd, osd = get_state_dict(model, [optimizer])
    dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=d)
    metadata = restricted_unpickle(os.path.join(d, ".metadata"))
with open(sys.argv[1], "wb") as f:
    Pickler(f, protocol=pickle.DEFAULT_PROTOCOL).dump(metadata)
