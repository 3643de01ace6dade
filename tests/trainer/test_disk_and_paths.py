"""Disk and paths: a full disk during a save said in words (where; latest kept), folders that cannot be written
found at validation (checkpoints, dumps, tracker folders), names that climb out of the run folder refused, symbolic
links in the checkpoint tree never followed and never fatal to a finished step."""

from __future__ import annotations

import errno
import os

import pytest

from npu_rl.config.loader import load_config
from npu_rl.parallel.manifest import MANIFEST, verify_manifest, write_manifest
from npu_rl.tracking.backends import tracker_folder_problems
from npu_rl.trainer.checkpoint import CheckpointManager, disk_full_error, verify_step
from npu_rl.trainer.preflight import run_folder_problems
from npu_rl.utils.paths import check_output_dir
from npu_rl.utils.safe_load import CorruptFileError

UNWRITABLE = "/proc/npu_rl_nowhere"  # exists-looking, permission bits say writable to root, mkdir fails


def test_a_folder_that_cannot_be_made_is_refused_even_for_root():
    with pytest.raises(PermissionError, match="nothing can be written in /proc"):
        check_output_dir(UNWRITABLE, "trainer.default_local_dir")


@pytest.mark.parametrize("override, words", [
    (f"trainer.default_local_dir={UNWRITABLE}", "trainer.default_local_dir='/proc/npu_rl_nowhere'"),
    (f"trainer.rollout_data_dir={UNWRITABLE}", "trainer.rollout_data_dir="),
    (f"trainer.validation_data_dir={UNWRITABLE}/v", "trainer.validation_data_dir="),
    ("trainer.experiment_name=../../elsewhere", "trainer.experiment_name='../../elsewhere' would put files outside"),
    ("trainer.project_name=/abs", "trainer.project_name='/abs' would put files outside"),
])
def test_run_paths_are_checked_at_validation(tmp_path, override, words):
    overrides = [f"trainer.default_local_dir={tmp_path}/ckpt", override]
    problems = run_folder_problems(load_config(overrides))
    assert any(words in p for p in problems), problems


@pytest.mark.parametrize("logger, variable, value", [
    ("tensorboard", "TENSORBOARD_DIR", UNWRITABLE), ("wandb", "WANDB_DIR", UNWRITABLE),
    ("mlflow", "MLFLOW_TRACKING_URI", f"file:{UNWRITABLE}"), ("trackio", "TRACKIO_DIR", UNWRITABLE)])
def test_unwritable_tracker_folders_fail_at_validation(logger, variable, value, tmp_path):
    (problem,) = tracker_folder_problems([logger], {variable: value})
    assert problem.startswith(f"trainer.logger={logger!r}: {variable}=") and "nothing can be written" in problem
    assert tracker_folder_problems([logger], {variable: str(tmp_path / "ok")}) == []
    assert tracker_folder_problems(["console"], {variable: value}) == []


def test_symlinks_in_the_checkpoint_tree_are_never_followed(tmp_path):
    root, outside = tmp_path / "ckpt", tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    root.mkdir()
    os.symlink(outside, root / "global_step_2.tmp")
    os.symlink(outside, root / "global_step_2")
    manager = CheckpointManager(str(root))
    tmp = manager.begin(2)  # the linked .tmp is removed as a link
    assert not os.path.islink(tmp) and (outside / "keep.txt").read_text() == "mine"
    os.makedirs(os.path.join(tmp, "actor"))
    with open(os.path.join(tmp, "actor", "weights.bin"), "wb") as f:
        f.write(b"w")
    os.symlink(outside / "keep.txt", os.path.join(tmp, "actor", "linked.txt"))
    write_manifest(os.path.join(tmp, "actor"))
    final = manager.commit(2, tmp, {"global_step": 2})  # the linked step folder is replaced, its target kept
    assert not os.path.islink(final) and (outside / "keep.txt").read_text() == "mine"
    assert set(verify_manifest(os.path.join(final, "actor"))) == {"weights.bin"}  # the link is not listed
    verify_step(final)
    os.symlink(final, root / "global_step_3")
    with pytest.raises(CorruptFileError, match="is a symbolic link"):
        verify_step(str(root / "global_step_3"))
    os.remove(os.path.join(final, "actor", "weights.bin"))
    os.symlink(outside / "keep.txt", os.path.join(final, "actor", "weights.bin"))
    with pytest.raises(CorruptFileError, match="never read through links"):
        verify_manifest(os.path.join(final, "actor"))
    assert os.path.isfile(os.path.join(final, MANIFEST))


def test_disk_full_is_said_in_words(tmp_path):
    dcp_style = RuntimeError("enforce fail at inline_container.cc: unexpected pos 4096 vs 1234")
    dcp_style.__cause__ = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.distcp"))
    error = disk_full_error(dcp_style, str(tmp_path))
    assert error is not None and error.strerror.startswith(f"disk full at {tmp_path / 'x.distcp'} (")
    assert disk_full_error(RuntimeError("something else"), str(tmp_path)) is None


def test_too_little_free_space_for_a_checkpoint_is_found_before_the_models_load(tiny_model_dir, tmp_path, monkeypatch):
    from npu_rl.trainer import checkpoint

    overrides = [f"trainer.default_local_dir={tmp_path}/ckpt", f"actor_rollout_ref.model.path={tiny_model_dir}",
                 "trainer.save_freq=10"]
    assert run_folder_problems(load_config(overrides)) == []
    monkeypatch.setattr(checkpoint, "free_bytes", lambda path: 1024)
    (problem,) = run_folder_problems(load_config(overrides))
    assert "0.00 GiB free, but one checkpoint of this model needs at least" in problem
    assert run_folder_problems(load_config(overrides + ["actor_rollout_ref.model.lora_rank=4"])) == []
    assert run_folder_problems(load_config(overrides + ["trainer.save_freq=-1", "trainer.save_on_interrupt=False"])) == []
