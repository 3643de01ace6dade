"""Checkpoints someone else made, and checkpoints that rotted: nothing runs, the bad file is named, auto-resume
falls back to the newest step that verifies.

Each crafted file below holds a pickle that would create a marker file when loaded the old way
(``torch.load(weights_only=False)`` / ``pickle.load``); the tests check that loading refuses and the marker never
appears, on resume (trainer state, per-rank extra, DCP metadata and items), merge and eval.
"""

from __future__ import annotations

import io
import os
import pickle

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from npu_rl.parallel.checkpoint import MODEL_OPTIM_DIR, load_checkpoint, merge_checkpoint, save_checkpoint
from npu_rl.parallel.manifest import write_manifest
from npu_rl.trainer.checkpoint import CheckpointManager, load_trainer_state, verify_step
from npu_rl.utils.safe_load import CorruptFileError, UnsafeFileError, load_state, save_state
from tests.parallel.common import tiny_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class _Payload:
    """Pickles as a call of os.system: what a malicious checkpoint would carry."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _model_and_optimizer(seed=0):
    model = tiny_model(seed=seed, layers=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randint(3, 100, (2, 6))).logits.sum().backward()
    optimizer.step()
    return model, optimizer


def _trainer_state(step: int) -> dict:
    import random

    return {"global_step": step, "prompts": {"epoch": 0, "batches_done": step},
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
            "kl_ctrl": {"value": 0.1}, "consecutive_nan_steps": 0}


def _save_step(root: str, step: int, seed: int = 0) -> str:
    manager = CheckpointManager(root)
    tmp = manager.begin(step)
    model, optimizer = _model_and_optimizer(seed)
    save_checkpoint(os.path.join(tmp, "actor"), model, optimizer, extra={"scheduler": {"last_epoch": step},
                                                                          "rng": {"numpy": np.random.get_state()}})
    return manager.commit(step, tmp, _trainer_state(step))


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "run")


@pytest.fixture
def marker(tmp_path):
    return str(tmp_path / "pwned")


def _rehash(step_path: str) -> None:
    """What an attacker would do: make the manifests match the crafted files."""
    write_manifest(os.path.join(step_path, "actor"))
    write_manifest(step_path, ["trainer_state.pt", os.path.join("actor", "manifest.json")])


def test_state_round_trips_exactly_through_the_safe_format(tmp_path):
    state = _trainer_state(3) | {"pairs": {(1, 2): "x"}, "array": np.arange(6, dtype=np.float32).reshape(2, 3)}
    save_state(state, str(tmp_path / "s.pt"))
    back = load_state(str(tmp_path / "s.pt"))
    assert back["rng"]["python"] == state["rng"]["python"] and back["pairs"] == {(1, 2): "x"}
    for a, b in zip(back["rng"]["numpy"], state["rng"]["numpy"]):
        assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
    assert back["array"].dtype == np.float32 and np.array_equal(back["array"], state["array"])
    np.random.set_state(back["rng"]["numpy"])  # usable as is
    with pytest.raises(TypeError, match=r"s2.pt.bad: a .*_Payload cannot be saved safely"):
        save_state({"bad": _Payload("x")}, str(tmp_path / "s2.pt"))


def test_a_whole_checkpoint_verifies_resumes_and_merges(root, tmp_path):
    path = _save_step(root, 1)
    verify_step(path)
    assert load_trainer_state(path)["global_step"] == 1
    model, optimizer = _model_and_optimizer(seed=5)
    extra = load_checkpoint(os.path.join(path, "actor"), model, optimizer)
    assert extra["scheduler"] == {"last_epoch": 1}
    merge_checkpoint(os.path.join(path, "actor"), str(tmp_path / "merged"))
    assert CheckpointManager(root).resume_dir("auto", None) == path


def test_a_crafted_trainer_state_is_refused_and_runs_nothing(root, marker):
    path = _save_step(root, 1)
    torch.save({"global_step": _Payload(marker)}, os.path.join(path, "trainer_state.pt"))
    _rehash(path)
    verify_step(path)  # the manifest matches: it proves integrity, not authorship
    with pytest.raises(UnsafeFileError, match="trainer_state.pt was not loaded"):
        load_trainer_state(path)
    assert not os.path.exists(marker)


def test_a_crafted_rank_extra_is_refused_and_runs_nothing(root, marker):
    path = _save_step(root, 1)
    torch.save({"scheduler": _Payload(marker)}, os.path.join(path, "actor", "extra", "rank_0.pt"))
    _rehash(path)
    model, optimizer = _model_and_optimizer()
    with pytest.raises(UnsafeFileError, match="rank_0.pt was not loaded"):
        load_checkpoint(os.path.join(path, "actor"), model, optimizer)
    assert not os.path.exists(marker)


def test_crafted_dcp_metadata_runs_nothing_on_resume_merge_and_eval(root, marker, tmp_path):
    path = _save_step(root, 1)
    actor = os.path.join(path, "actor")
    with open(os.path.join(actor, MODEL_OPTIM_DIR, ".metadata"), "wb") as f:
        pickle.dump(_Payload(marker), f)
    _rehash(path)
    model, optimizer = _model_and_optimizer()
    with pytest.raises(UnsafeFileError, match=r"\.metadata was not loaded: it asks for posix.system"):
        load_checkpoint(actor, model, optimizer)
    with pytest.raises(UnsafeFileError, match=r"\.metadata was not loaded"):
        merge_checkpoint(actor, str(tmp_path / "merged"))
    from npu_rl.commands.evaluate import _model_folder
    from npu_rl.commands.merge import main as merge_main

    with pytest.raises(UnsafeFileError):
        _model_folder(path, str(tmp_path / "eval_tmp"))
    assert merge_main([path, "--out", str(tmp_path / "merged2")]) == 2
    assert not os.path.exists(marker)


def test_a_crafted_dcp_item_runs_nothing_on_resume(root, marker):
    """A non-tensor item (an optimizer hyper-parameter) whose bytes are a malicious pickle."""
    path = _save_step(root, 1)
    actor = os.path.join(path, "actor")
    model, optimizer = _model_and_optimizer()
    msd, osd = get_state_dict(model, [optimizer])
    osd["param_groups"][0]["lr"] = _Payload(marker)
    dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=os.path.join(actor, MODEL_OPTIM_DIR))
    _rehash(path)
    model, optimizer = _model_and_optimizer(seed=3)
    with pytest.raises(UnsafeFileError, match="param_groups.0.lr.* was not loaded"):
        load_checkpoint(actor, model, optimizer)
    assert not os.path.exists(marker)


def _flip_a_byte(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, io.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


def _distcp(step_path: str) -> str:
    folder = os.path.join(step_path, "actor", MODEL_OPTIM_DIR)
    return os.path.join(folder, next(n for n in os.listdir(folder) if n.endswith(".distcp")))


def test_a_corrupt_distcp_is_named_and_auto_resume_falls_back(root, capsys):
    first = _save_step(root, 1)
    second = _save_step(root, 2, seed=1)
    bad = _distcp(second)
    _flip_a_byte(bad)
    with pytest.raises(CorruptFileError, match=f"{bad} is corrupt"):
        verify_step(second)
    assert CheckpointManager(root).resume_dir("auto", None) == first
    err = capsys.readouterr().err
    assert bad in err and f"newest checkpoint that verifies, {first}" in err
    with pytest.raises(CorruptFileError, match="is corrupt"):  # named, not resumed silently
        CheckpointManager(root).resume_dir("resume_path", second)
    with pytest.raises(CorruptFileError, match=f"{bad} is corrupt"):
        merge_checkpoint(os.path.join(second, "actor"), os.path.join(root, "merged"))


def test_a_truncated_trainer_state_is_named_and_nothing_verifying_is_an_error(root, capsys):
    only = _save_step(root, 1)
    state = os.path.join(only, "trainer_state.pt")
    with open(state, "r+b") as f:
        f.truncate(100)
    with pytest.raises(CorruptFileError, match=r"no checkpoint under .* verifies(.|\n)*trainer_state.pt is corrupt"):
        CheckpointManager(root).resume_dir("auto", None)
    write_manifest(only, ["trainer_state.pt", os.path.join("actor", "manifest.json")])  # consistent, but truncated
    with pytest.raises(CorruptFileError, match="trainer_state.pt is unreadable"):
        load_trainer_state(only)


def test_a_folder_without_a_manifest_is_not_taken_for_a_checkpoint(root, tmp_path):
    path = _save_step(root, 1)
    os.remove(os.path.join(path, "actor", "manifest.json"))
    with pytest.raises(CorruptFileError, match="not recognised as an npu-rl checkpoint"):
        merge_checkpoint(os.path.join(path, "actor"), str(tmp_path / "merged"))
