"""The Ray backend with CPU actors: ranks, env, torch.distributed on gloo, dispatch modes, colocation, split pools.

One Ray session for the whole module (start ~5 s); ``num_cpus=4`` is a logical count so two 2-actor groups can
coexist on this 2-core machine (the workers are idle most of the time).
"""

from __future__ import annotations

import time

import pytest
import torch

from npu_rl.controller import LocalWorkerGroup, RayWorkerGroup, ResourcePool, WorkerSpec
from npu_rl.protocol import Batch
from tests.controller.workers import CounterWorker, EchoWorker

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray




@pytest.fixture(scope="module")
def echo_group(ray_session):
    pool = ResourcePool([2], resource=None, name="echo")
    group = RayWorkerGroup(pool, {"echo": WorkerSpec(EchoWorker), "counter": WorkerSpec(CounterWorker, (10,))},
                           env={"NPU_RL_TEST_ENV": "yes"})
    yield group
    group.shutdown()
    pool.remove()


def test_ranks_env_and_process_group(echo_group):
    info = echo_group.echo.whoami()
    assert [i["env"]["RANK"] for i in info] == ["0", "1"]
    assert {i["env"]["WORLD_SIZE"] for i in info} == {"2"}
    assert [i["env"]["LOCAL_RANK"] for i in info] == ["0", "1"]
    assert len({i["env"]["MASTER_PORT"] for i in info}) == 1
    assert [i["dist"] for i in info] == [(0, 2, "gloo"), (1, 2, "gloo")]
    assert echo_group.echo.all_reduce(1.0) == [3.0, 3.0]  # 1*1 + 1*2 through gloo


def test_actors_are_seeded_before_their_workers_are_built(ray_session):
    pool = ResourcePool([2], resource=None, name="seeded")
    group = RayWorkerGroup(pool, {"echo": WorkerSpec(EchoWorker)}, seed=7)
    try:
        expected = torch.Generator().manual_seed(7)
        assert group.echo.drawn_at_build() == [torch.rand(1, generator=expected).item()] * 2
    finally:
        group.shutdown()
        pool.remove()


def test_colocated_roles_share_the_actor(echo_group):
    assert echo_group.counter.pid() == [i["pid"] for i in echo_group.echo.whoami()]
    assert echo_group.counter.add(1) == [11, 11]
    assert echo_group.counter.add(1) == [12, 12]  # state persists in the actor


def test_dp_split_concat_and_rank0(echo_group):
    batch = Batch({"x": torch.arange(6.0)}, {"name": list("abcdef")})
    out = echo_group.echo.scale(batch, factor=10.0)
    assert out["y"].tolist() == [0, 10, 20, 30, 40, 50]
    assert out["rank"].tolist() == [0, 0, 0, 1, 1, 1]
    assert out["tag"].tolist() == ["r0"] * 3 + ["r1"] * 3
    assert echo_group.echo.count(batch) == [{"rank": 0, "rows": 3, "first": 0}, {"rank": 1, "rows": 3, "first": 3}]
    assert echo_group.echo.rank_zero() == 0
    with pytest.raises(ValueError, match="cannot be split evenly"):
        echo_group.echo.scale(Batch({"x": torch.arange(3.0)}))


def test_non_blocking_calls_overlap(echo_group):
    batch = Batch({"x": torch.ones(4, 2)})
    start = time.perf_counter()
    pending = echo_group.echo.slow_sum(batch, delay_s=0.5)
    submitted = time.perf_counter() - start
    result = pending.get()
    assert submitted < 0.4  # the call returned before the workers finished
    assert result.tolist() == [[2.0, 2.0], [2.0, 2.0]]  # each dp rank summed its 2 rows


def test_worker_exception_reaches_the_driver(echo_group):
    with pytest.raises(Exception, match="unexpected keyword"):
        echo_group.echo.scale(Batch({"x": torch.arange(2.0)}), bogus=1)


def test_sequence_parallel_layout_keeps_one_output_per_group(ray_session):
    pool = ResourcePool([2], resource=None, name="sp")
    group = RayWorkerGroup(pool, {"echo": WorkerSpec(EchoWorker, kwargs={"sp_size": 2})})
    try:
        batch = Batch({"x": torch.arange(4.0)})
        out = group.echo.scale(batch)  # dp=1, sp=2: both ranks get all 4 rows, rank 0's output is kept
        assert out["y"].tolist() == [0, 2, 4, 6] and out["rank"].tolist() == [0] * 4
        assert group.echo.num_calls() == [1, 1]
    finally:
        group.shutdown()
        pool.remove()


def test_split_pools_are_separate_groups(ray_session):
    pools = [ResourcePool([1], resource=None, name=f"split{i}") for i in range(2)]
    groups = [RayWorkerGroup(p, {"counter": WorkerSpec(CounterWorker, (i,))}) for i, p in enumerate(pools)]
    try:
        assert groups[0].counter.add(1) == [1] and groups[1].counter.add(1) == [2]
        assert groups[0].counter.pid() != groups[1].counter.pid()
        assert groups[0].world_size == groups[1].world_size == 1
    finally:
        for group, pool in zip(groups, pools):
            group.shutdown()
            pool.remove()


def test_failed_worker_start_releases_the_actors(ray_session):
    from tests.controller.workers import BrokenWorker

    pool = ResourcePool([2], resource=None, name="broken")
    try:
        with pytest.raises(Exception, match="model folder not found"):
            RayWorkerGroup(pool, {"broken": WorkerSpec(BrokenWorker)})
        group = RayWorkerGroup(pool, {"counter": WorkerSpec(CounterWorker)})  # the bundles were freed
        assert group.counter.add(1) == [1, 1]
        group.shutdown()
    finally:
        pool.remove()


def _pool_states(prefix: str) -> set[str]:
    return {info["state"] for info in ray.util.placement_group_table().values() if info["name"].startswith(prefix)}


def test_a_group_that_owns_its_pool_gives_the_devices_back(ray_session):
    """owns_pool (the trainer's groups): a failed start and a shutdown both remove the pool's placement groups, so
    a later run in the same process can reserve the devices again."""
    from tests.controller.workers import BrokenWorker

    pool = ResourcePool([2], resource=None, name="owned_broken")
    with pytest.raises(Exception, match="model folder not found"):
        RayWorkerGroup(pool, {"broken": WorkerSpec(BrokenWorker)}, owns_pool=True)
    assert _pool_states("owned_broken") == {"REMOVED"}
    pool = ResourcePool([2], resource=None, name="owned_ok")
    group = RayWorkerGroup(pool, {"counter": WorkerSpec(CounterWorker)}, owns_pool=True)
    assert group.counter.add(1) == [1, 1] and _pool_states("owned_ok") == {"CREATED"}
    group.shutdown()
    group.shutdown()  # twice: nothing left to stop
    assert _pool_states("owned_ok") == {"REMOVED"}


def test_pool_that_cannot_be_placed_fails_clearly(ray_session):
    pool = ResourcePool([64], resource=None, name="too_big", ready_timeout_s=1.0)
    with pytest.raises(RuntimeError, match="could not reserve"):
        pool.placement_groups()


def test_colocated_fsdp_roles_with_different_sp_match_in_process(ray_session):
    # One actor per device holds two roles, one with sp=1 (dp=2) and one with sp=2 (dp=1), like a critic and an
    # actor with different ulysses_sequence_parallel_size: each role has its own mesh and dispatch layout.
    from tests.controller.workers import TinyPolicyWorker
    from tests.parallel.common import make_batch

    input_ids, mask = make_batch(rows=4)
    batch = Batch({"input_ids": input_ids, "attention_mask": mask})
    local = LocalWorkerGroup({"actor": WorkerSpec(TinyPolicyWorker)}).actor.compute_log_prob(batch)
    pool = ResourcePool([2], resource=None, name="fsdp")
    group = RayWorkerGroup(pool, {"dp2": WorkerSpec(TinyPolicyWorker, kwargs={"sp_size": 1}),
                                  "sp2": WorkerSpec(TinyPolicyWorker, kwargs={"sp_size": 2})})
    try:
        results = {role: getattr(group, role).compute_log_prob(batch) for role in ("dp2", "sp2")}
        assert [lay.dp_size for lay in group.layouts("sp2")] == [1, 1]
    finally:
        group.shutdown()
        pool.remove()
    for role, remote in results.items():
        # float32; packed attention over 1 or 2 ranks sums in a different order: atol=1e-5
        torch.testing.assert_close(remote["old_log_probs"], local["old_log_probs"], atol=1e-5, rtol=1e-5, msg=role)
