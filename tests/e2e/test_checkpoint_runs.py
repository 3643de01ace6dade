"""Checkpoints of real trainings (they train end to end, so they run in this lane): a run folder whose trainer
state and DCP metadata were swapped for malicious pickles resumes nothing; a save on a full disk keeps the latest
step and says so. The crafted-file helpers are those of tests/trainer/test_checkpoints.py."""

from __future__ import annotations

import errno
import os
import pickle

import pytest
import torch

from npu_rl.parallel.checkpoint import MODEL_OPTIM_DIR
from npu_rl.trainer import checkpoint
from npu_rl.trainer.checkpoint import step_dir
from npu_rl.trainer.main_ppo import main
from npu_rl.utils.safe_load import UnsafeFileError, save_state
from tests.trainer.conftest import base_overrides, run_training
from tests.trainer.test_checkpoints import _Payload, _rehash, _trainer_state, marker  # noqa: F401 (fixture)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_resuming_a_crafted_run_folder_runs_nothing_end_to_end(tiny_model_dir, tmp_path, marker, capsys):
    """A real run's folder, its trainer state and DCP metadata swapped for malicious pickles (manifests rehashed)."""
    out = str(tmp_path / "run")
    overrides = base_overrides(tiny_model_dir, out) + ["preset=grpo", "trainer.val_before_train=False",
                                                       "trainer.total_training_steps=1", "trainer.save_freq=1"]
    assert run_training(overrides) == 0
    step = os.path.join(out, "global_step_1")
    with open(os.path.join(step, "actor", MODEL_OPTIM_DIR, ".metadata"), "wb") as f:
        pickle.dump(_Payload(marker), f)
    torch.save({"global_step": _Payload(marker)}, os.path.join(step, "trainer_state.pt"))
    _rehash(step)
    assert main(overrides[:-2] + ["trainer.total_training_steps=2", "trainer.resume_mode=auto"]) == 2
    assert "trainer_state.pt was not loaded" in capsys.readouterr().err
    os.remove(os.path.join(step, "trainer_state.pt"))
    save_state(_trainer_state(1), os.path.join(step, "trainer_state.pt"))  # only the metadata is crafted now
    _rehash(step)
    with pytest.raises(UnsafeFileError, match=r"\.metadata was not loaded"):
        run_training(overrides[:-2] + ["trainer.total_training_steps=2", "trainer.resume_mode=auto"])
    assert not os.path.exists(marker)


def test_a_save_on_a_full_disk_keeps_latest_and_says_so(tiny_model_dir, tmp_path, reward_file, capsys, monkeypatch):
    real, calls = checkpoint.save_state, []

    def fills_up(state, path):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real(state, path)

    monkeypatch.setattr(checkpoint, "save_state", fills_up)
    out = str(tmp_path / "out")
    overrides = base_overrides(tiny_model_dir, out, reward_file) + [
        "preset=grpo", "trainer.total_training_steps=2", "trainer.save_freq=1", "trainer.val_before_train=False"]
    assert main(overrides, default_config="ppo_trainer") == 1
    err = capsys.readouterr().err
    assert f"npu-rl: error: disk full at {step_dir(out, 2)}.tmp/trainer_state.pt" in err and "Traceback" not in err
    assert checkpoint.latest_step(out) == 1 and sorted(os.listdir(out)) == ["global_step_1",
                                                                           "latest_checkpointed_iteration.txt", "logs"]
