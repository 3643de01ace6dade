"""Dispatch modes and the in-process worker group (world size 1)."""

from __future__ import annotations

import pytest
import torch

from npu_rl.controller import Dispatch, DispatchLayout, LocalWorkerGroup, Pending, WorkerSpec, register
from npu_rl.controller.dispatch import collect_outputs, pad_rows, split_inputs, trim_rows
from npu_rl.controller.worker_group import WorkerGroup
from npu_rl.protocol import Batch
from tests.controller.workers import CounterWorker, EchoWorker


def _batch(n: int) -> Batch:
    return Batch({"x": torch.arange(n)}, {"name": [f"s{i}" for i in range(n)]})


def test_local_group_calls_are_direct():
    import torch.distributed as dist

    # An in-process vLLM engine of an earlier test may have started a one-rank group; the group must not start one.
    started_before = dist.is_initialized()
    group = LocalWorkerGroup({"echo": WorkerSpec(EchoWorker)})
    batch = _batch(5)
    out = group.echo.scale(batch, factor=3.0)
    assert torch.equal(out["y"], torch.arange(5) * 3.0)
    assert group.scale(batch)["y"].tolist() == [0, 2, 4, 6, 8]  # one role: methods on the group itself
    who = group.echo.whoami()  # ALL -> a list of one; no process group needed
    assert len(who) == 1 and dist.is_initialized() == started_before
    assert started_before or who[0]["dist"] is False
    assert group.echo.rank_zero() == 0
    pending = group.echo.slow_sum(batch)
    assert isinstance(pending, Pending) and pending.get().tolist() == [10]
    assert group.worker().calls == 2


def test_unregistered_method_and_unknown_role_are_errors():
    group = LocalWorkerGroup({"echo": WorkerSpec(EchoWorker), "counter": WorkerSpec(CounterWorker, (5,))})
    with pytest.raises(AttributeError, match="not a registered worker method.*whoami"):
        group.echo.unregistered()
    with pytest.raises(AttributeError, match="no role 'critic'"):
        group.critic
    assert group.counter.add(2) == [7]


def test_register_rejects_non_modes():
    with pytest.raises(TypeError, match="Dispatch mode"):
        register("dp")


def test_dp_split_with_sequence_parallel_layout():
    # 4 ranks, sp=2: ranks 0,1 hold dp shard 0 and ranks 2,3 shard 1; ranks 0 and 2 collect.
    layouts = [DispatchLayout(r // 2, 2, r % 2 == 0) for r in range(4)]
    batch = _batch(6)
    per_rank = split_inputs(Dispatch.DP_SPLIT, 4, layouts, (batch, 7), {"extra": _batch(6)})
    assert [args[0]["x"].tolist() for args, _ in per_rank] == [[0, 1, 2]] * 2 + [[3, 4, 5]] * 2
    assert per_rank[0][0][0] is per_rank[1][0][0]  # the same piece object: Ray puts it once
    assert all(args[1] == 7 for args, _ in per_rank)  # non-batch arguments are broadcast
    assert per_rank[3][1]["extra"]["name"].tolist() == ["s3", "s4", "s5"]
    outputs = [Batch({"r": torch.full((3,), r)}) for r in range(4)]
    assert collect_outputs(Dispatch.DP_SPLIT, layouts, outputs)["r"].tolist() == [0, 0, 0, 2, 2, 2]
    assert collect_outputs(Dispatch.DP_SPLIT, layouts, [{"m": r} for r in range(4)]) == [{"m": 0}, {"m": 2}]
    assert collect_outputs(Dispatch.DP_SPLIT, layouts, [None] * 4) is None


def test_dp_split_errors_are_clear():
    layouts = [DispatchLayout(r, 2) for r in range(2)]
    with pytest.raises(ValueError, match="5 rows cannot be split evenly over 2"):
        split_inputs(Dispatch.DP_SPLIT, 2, layouts, (_batch(5),), {}, "actor.update")
    with pytest.raises(ValueError, match="exactly one collector"):
        split_inputs(Dispatch.DP_SPLIT, 2, [DispatchLayout(0, 2), DispatchLayout(0, 2)], (_batch(4),), {})


def test_rank0_and_all_modes():
    assert split_inputs(Dispatch.RANK0, 3, None, (1,), {}) == [((1,), {}), None, None]
    assert collect_outputs(Dispatch.RANK0, None, ["a", None, None]) == "a"
    assert split_inputs(Dispatch.ALL, 2, None, (1,), {"k": 2}) == [((1,), {"k": 2})] * 2
    assert collect_outputs(Dispatch.ALL, None, [1, 2]) == [1, 2]


class _InProcessRanks(WorkerGroup):
    """``world_size`` workers in this process, each told its rank: the split / gather path of a Ray group, without
    Ray."""

    def __init__(self, roles, world_size: int):
        super().__init__(roles)
        self.world_size = world_size
        self.workers = []
        for rank in range(world_size):
            worker = next(iter(roles.values())).build()
            worker.rank, worker.world_size = rank, world_size
            self.workers.append(worker)

    def _run(self, role, method, per_rank):
        outs = [None if inputs is None else getattr(w, method)(*inputs[0], **inputs[1])
                for w, inputs in zip(self.workers, per_rank)]
        return lambda: outs

    def _query_layouts(self, role):
        return [w.dispatch_layout() for w in self.workers]


def test_a_method_that_pads_rows_takes_any_batch_and_returns_the_rows_it_was_given():
    # 5 rows over 2 ranks: rows 0..4 plus a copy of row 4 -> rank 0 scales [0, 1, 2], rank 1 [3, 4, 4]; the copy is
    # dropped from what comes back
    group = _InProcessRanks({"echo": WorkerSpec(EchoWorker)}, world_size=2)
    out = group.echo.scale_any_rows(_batch(5), factor=10.0)
    assert out["y"].tolist() == [0, 10, 20, 30, 40]
    assert out["rank"].tolist() == [0, 0, 0, 1, 1]
    assert list(out["tag"]) == ["r0", "r0", "r0", "r1", "r1"]
    assert [w.calls for w in group.workers] == [1, 1]
    assert group.echo.scale_any_rows(_batch(4))["rank"].tolist() == [0, 0, 1, 1]  # a multiple: nothing added
    # a method that trains on its rows (no pad_rows) still refuses a batch its ranks cannot share evenly
    with pytest.raises(ValueError, match="5 rows cannot be split evenly over 2"):
        group.echo.scale(_batch(5))


def test_pad_rows_and_trim_rows():
    batch = _batch(3)
    args, kwargs, rows = pad_rows((batch, 7), {"other": _batch(3)}, 4)
    assert rows == 3 and args[0]["x"].tolist() == [0, 1, 2, 2] and args[1] == 7
    assert list(kwargs["other"]["name"]) == ["s0", "s1", "s2", "s2"]
    assert pad_rows((batch,), {}, 3)[2] is None  # already a multiple
    with pytest.raises(ValueError, match="different lengths"):
        pad_rows((batch, _batch(2)), {}, 2)
    assert trim_rows(torch.arange(4), 3).tolist() == [0, 1, 2]
    assert trim_rows(Batch({"x": torch.arange(4)}), 3)["x"].tolist() == [0, 1, 2]
    assert trim_rows(torch.arange(4), None).tolist() == [0, 1, 2, 3]
