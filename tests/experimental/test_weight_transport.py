"""The weight push between pools: two receiver processes join a gloo group with the sender and get every tensor
back bit for bit (names, dtypes, shapes), over several buckets."""

from __future__ import annotations

import multiprocessing as mp
import socket

import torch

from npu_rl.parallel.weight_transport import join_weight_group, receive_weights, send_weights


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _receive(port: int, rank: int, queue) -> None:
    wg = join_weight_group("gloo", "127.0.0.1", port, rank, 3, torch.device("cpu"), timeout_s=60)
    queue.put([(name, str(t.dtype), list(t.shape), t.float().flatten().tolist()) for name, t in receive_weights(wg)])


def test_two_receivers_get_every_tensor_in_buckets():
    weights = {"model.a.weight": torch.randn(3, 4), "model.b": torch.arange(5, dtype=torch.int64),
               "lm_head.weight": torch.randn(2, 2).bfloat16()}
    port, ctx = _free_port(), mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_receive, args=(port, rank, queue)) for rank in (1, 2)]
    for p in procs:
        p.start()
    wg = join_weight_group("gloo", "127.0.0.1", port, 0, 3, torch.device("cpu"), timeout_s=60)
    # a 64-byte bucket: a (48 bytes) alone, then b (40) + lm_head (8) together
    metrics = send_weights(wg, weights.items(), bucket_megabytes=64 / (1 << 20))
    assert metrics["weight_sync/buckets"] == 2 and metrics["weight_sync/bytes"] == 48 + 40 + 8
    for _ in procs:
        got = queue.get(timeout=60)
        assert [g[0] for g in got] == list(weights)
        for (name, dtype, shape, values), want in zip(got, weights.values()):
            assert dtype == str(want.dtype) and shape == list(want.shape)
            assert torch.equal(torch.tensor(values), want.float().flatten())
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
