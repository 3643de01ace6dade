"""Mesh sizes (dp x sp, HSDP) and init_distributed in a plain single process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from npu_rl.parallel import check_parallel_sizes

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_parallel_sizes():
    assert check_parallel_sizes(8) == (8, 8)
    assert check_parallel_sizes(8, sp_size=4) == (2, 8)
    assert check_parallel_sizes(8, sp_size=2, fsdp_size=4) == (4, 4)  # HSDP: 2 replicas of 4-way shards
    assert check_parallel_sizes(8, fsdp_size=8) == (8, 8)
    with pytest.raises(ValueError, match="ulysses_sequence_parallel_size=3 must be >= 1 and divide"):
        check_parallel_sizes(8, sp_size=3)
    with pytest.raises(ValueError, match="fsdp_config.fsdp_size=3 is invalid for 8 devices"):
        check_parallel_sizes(8, fsdp_size=3)
    with pytest.raises(ValueError, match="fsdp_size=16"):
        check_parallel_sizes(8, fsdp_size=16)


def mesh_job() -> list:
    from npu_rl.parallel import build_mesh

    out = []
    for sp_size, fsdp_size in [(1, -1), (2, -1), (1, 1)]:
        mesh = build_mesh(sp_size=sp_size, fsdp_size=fsdp_size)
        out.append((mesh.dp_size, mesh.sp_size, mesh.dp_rank, mesh.sp_rank, mesh.sp_group is not None,
                    tuple(mesh.fsdp_mesh.shape), mesh.dispatch_layout()))
    return out


@pytest.mark.dist
def test_build_mesh_on_two_ranks(dist_pool2):
    from npu_rl.controller import DispatchLayout

    rank0, rank1 = dist_pool2.run(mesh_job)
    assert rank0[0] == (2, 1, 0, 0, False, (2,), DispatchLayout(0, 2, True))
    assert rank1[0] == (2, 1, 1, 0, False, (2,), DispatchLayout(1, 2, True))
    assert rank1[1] == (1, 2, 0, 1, True, (2,), DispatchLayout(0, 1, False))  # same shard, not the collector
    assert rank0[2][5] == (2, 1)  # HSDP: 2 replicas x 1-way shards


SINGLE_PROCESS = """
import os, torch
for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
    os.environ.pop(key, None)
from npu_rl.parallel import FSDPSettings, apply_fsdp2, build_mesh, init_distributed, clip_grad_norm
from tests.parallel.common import make_batch, mean_nll, tiny_model
assert init_distributed() == (0, 1) and init_distributed() == (0, 1)  # idempotent
model = apply_fsdp2(tiny_model(), build_mesh(), FSDPSettings())
ref = tiny_model()
ids, mask = make_batch()
mean_nll(model, ids, mask).backward()
mean_nll(ref, ids, mask).backward()
norm = clip_grad_norm(model, 1e9)
torch.testing.assert_close(norm, torch.nn.utils.clip_grad_norm_(ref.parameters(), 1e9))
print("OK", flush=True)
os._exit(0)  # all checked: the interpreter's teardown of torch and the gloo group costs ~1 s and checks nothing
"""


def test_single_process_world_of_one_runs_fsdp2():
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env.update(DEVICE="cpu", PYTHONPATH=REPO_ROOT, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", SINGLE_PROCESS], env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
