"""A save that fails for lack of room says so in words and leaves the previous checkpoint as ``latest``, with no
``global_step_N.tmp`` behind, also when the failure comes from inside DCP: its ``CheckpointException`` is a
``BaseException`` (the trainer caught ``Exception`` and so never saw it: issue 39 met DCP's ``unexpected pos 704 vs
598`` traceback and a leftover ``.tmp`` on a 3 MB tmpfs, a 20 MB one and under ``ulimit -f``).

The file-size limit case runs in a child process: lowering ``RLIMIT_FSIZE`` in pytest's own process could cut its
capture files. The child is a fork of pytest's process, which has torch, DCP and the trainer imported already (a fresh
interpreter spent seconds importing them); Python ignores ``SIGXFSZ``, in the fork as in a fresh interpreter, so the
write past the limit fails with ``EFBIG`` instead of killing the child."""

from __future__ import annotations

import errno
import os
import resource
import traceback
import types

import pytest
import torch.distributed.checkpoint.filesystem as dcp_filesystem

from npu_rl.parallel.checkpoint import save_checkpoint
from npu_rl.trainer.checkpoint import MARKER, CheckpointManager, DiskFullError, disk_full_error
from npu_rl.trainer.ppo_trainer import PPOTrainer
from tests.trainer.test_checkpoints import _model_and_optimizer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _trainer(root: str):
    """What ``PPOTrainer.save_checkpoint`` reads of its trainer: the checkpoint manager, the actor role, the plan."""
    model, optimizer = _model_and_optimizer()
    actor = types.SimpleNamespace(save_checkpoint=lambda path: save_checkpoint(path, model, optimizer,
                                                                               extra={"scheduler": {}}))
    trainer = types.SimpleNamespace(checkpoints=CheckpointManager(root), global_step=1,
                                    roles=types.SimpleNamespace(actor_rollout=actor, prm=None),
                                    run_settings=types.SimpleNamespace(use_critic=False))
    trainer.trainer_state = lambda: {"global_step": trainer.global_step}
    return trainer


def test_a_full_disk_inside_dcp_is_said_and_the_tmp_folder_removed(tmp_path, monkeypatch):
    root = str(tmp_path / "run")
    trainer = _trainer(root)
    PPOTrainer.save_checkpoint(trainer)
    trainer.global_step = 2

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dcp_filesystem, "_write_item", full)  # DCP wraps it in its CheckpointException
    with pytest.raises(DiskFullError, match=r"disk full at .*global_step_2\.tmp.*free some space"):
        PPOTrainer.save_checkpoint(trainer)
    assert sorted(os.listdir(root)) == ["global_step_1", MARKER]
    assert open(os.path.join(root, MARKER)).read().strip() == "1"


def _save_under_a_file_size_limit(root: str) -> str:
    """In the forked child: step 1 saved, then step 2 under a 100 kB file-size limit; what it raised, in words."""
    trainer = _trainer(root)
    PPOTrainer.save_checkpoint(trainer)
    trainer.global_step = 2
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        PPOTrainer.save_checkpoint(trainer)
    except OSError as exc:
        return f"{type(exc).__name__} {exc.strerror}\n"
    return ""


def _in_a_fork(fn, *args) -> str:
    """``fn(*args)``'s text, run in a forked child (its limits stay its own); a failure there fails the test."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(read_end)
            text, code = fn(*args), 0
        except BaseException:
            text = traceback.format_exc()
        finally:
            with os.fdopen(write_end, "w") as out:
                out.write(text)
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, text[-3000:]
    return text


def test_a_file_size_limit_is_said_and_the_tmp_folder_removed(tmp_path):
    root = str(tmp_path / "run")
    stdout = _in_a_fork(_save_under_a_file_size_limit, root)
    assert stdout.startswith(f"DiskFullError file-size limit reached at {root}/global_step_2.tmp/actor/"), stdout
    assert "(ulimit -f allows 100000 bytes): raise it (ulimit -f unlimited)" in stdout
    assert sorted(os.listdir(root)) == ["global_step_1", MARKER]


def test_a_full_disk_on_a_ray_worker_is_recognised(tmp_path):
    """A save on a Ray worker reaches the driver as RayTaskError, plain (``.cause``) or as an instance of the cause."""
    from ray.exceptions import RayTaskError
    from torch.distributed.checkpoint.api import CheckpointException

    dcp_error = CheckpointException("save failed", {0: (OSError(errno.ENOSPC, "No space left on device",
                                                                str(tmp_path / "x.distcp")), None)})
    remote = RayTaskError("save_checkpoint", "traceback", dcp_error)
    for exc in (remote, remote.as_instanceof_cause()):
        full = disk_full_error(exc, str(tmp_path))
        assert isinstance(full, DiskFullError) and f"disk full at {tmp_path / 'x.distcp'}" in full.strerror
    assert disk_full_error(RayTaskError("f", "tb", ValueError("other")), str(tmp_path)) is None
