"""Weights from the trainer pool to a separate rollout pool, in buckets, through a process group spanning both.

The two pools are separate torch.distributed jobs (each has its own default group), so the group that joins them
is built on its own from a TCP store: rank 0 is the trainer's rank 0 (the sender, which hosts the store), ranks
1..R are the rollout ranks. Its backend is the device layer's (``gloo`` on CPU; ``nccl`` / ``hccl`` on devices).

The stream is self-describing, so a receiver needs nothing but the group. Per bucket, rank 0 broadcasts::

    header   int64 [2]             (bytes of the manifest, bytes of the payload); (0, 0) ends the stream
    manifest uint8 [header[0]]     JSON: [[name, dtype, shape, offset, nbytes], ...]
    payload  uint8 [header[1]]     the bucket's tensors, back to back

A bucket holds tensors up to ``bucket_megabytes`` (a larger tensor goes alone), so the sender holds at most one
bucket beside the weights it streams from, and the receiver one bucket at a time.

Not run here: nccl / hccl (written against torch's ``ProcessGroupNCCL`` and torch_npu's ``ProcessGroupHCCL``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterable, Iterator

import torch
import torch.distributed as dist


@dataclass
class WeightGroup:
    """A process group over the sender (rank 0) and the receivers, and the device its buffers live on."""

    group: object
    rank: int
    world_size: int
    device: torch.device


def join_weight_group(backend: str, host: str, port: int, rank: int, world_size: int, device: torch.device,
                      timeout_s: float = 600.0) -> WeightGroup:
    """Join the group (every member calls this at the same time: it returns once all have joined)."""
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=timeout)
    if backend == "gloo":
        group = dist.ProcessGroupGloo(store, rank, world_size, timeout)
    elif backend == "nccl":
        group = dist.ProcessGroupNCCL(store, rank, world_size)
    elif backend == "hccl":
        from torch_npu._C._distributed_c10d import ProcessGroupHCCL  # torch_npu's class, as torch's NCCL one

        group = ProcessGroupHCCL(store, rank, world_size, timeout)
    else:
        raise ValueError(f"weight sync: no process group for backend {backend!r} (gloo | nccl | hccl)")
    return WeightGroup(group, rank, world_size, torch.device(device))


def _broadcast(wg: WeightGroup, tensor: torch.Tensor) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    wg.group.broadcast([tensor], opts).wait()


def _buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
             ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def send_weights(wg: WeightGroup, named_tensors: Iterable[tuple[str, torch.Tensor]],
                 bucket_megabytes: float = 512) -> dict[str, float]:
    """Rank 0: stream ``named_tensors`` to every receiver; returns ``weight_sync/*`` metrics."""
    if wg.rank != 0:
        raise RuntimeError("send_weights runs on rank 0 of the weight group (the trainer's rank 0)")
    start, total, num_buckets = time.perf_counter(), 0, 0
    for bucket in _buckets(named_tensors, int(bucket_megabytes * (1 << 20))):
        manifest, parts, offset = [], [], 0
        for name, tensor in bucket:
            flat = tensor.detach().contiguous().view(-1).view(torch.uint8)
            manifest.append([name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset, flat.numel()])
            parts.append(flat.to(wg.device))
            offset += flat.numel()
        text = torch.frombuffer(bytearray(json.dumps(manifest).encode()), dtype=torch.uint8).to(wg.device)
        _broadcast(wg, torch.tensor([text.numel(), offset], dtype=torch.int64, device=wg.device))
        _broadcast(wg, text)
        _broadcast(wg, torch.cat(parts))
        total, num_buckets = total + offset, num_buckets + 1
    _broadcast(wg, torch.zeros(2, dtype=torch.int64, device=wg.device))
    return {"weight_sync/send_s": time.perf_counter() - start, "weight_sync/bytes": float(total),
            "weight_sync/buckets": float(num_buckets)}


def receive_weights(wg: WeightGroup) -> Iterator[tuple[str, torch.Tensor]]:
    """Ranks 1..R: the ``(name, tensor)`` pairs of the stream, one bucket at a time (views of that bucket)."""
    if wg.rank == 0:
        raise RuntimeError("receive_weights runs on the rollout ranks (1..R) of the weight group")
    while True:
        header = torch.zeros(2, dtype=torch.int64, device=wg.device)
        _broadcast(wg, header)
        manifest_bytes, payload_bytes = (int(v) for v in header.tolist())
        if manifest_bytes == 0:
            return
        text = torch.empty(manifest_bytes, dtype=torch.uint8, device=wg.device)
        _broadcast(wg, text)
        payload = torch.empty(payload_bytes, dtype=torch.uint8, device=wg.device)
        _broadcast(wg, payload)
        for name, dtype, shape, offset, nbytes in json.loads(bytes(text.cpu().tolist()).decode()):
            yield name, payload[offset: offset + nbytes].view(getattr(torch, dtype)).view(shape)


class PushSignal:
    """"A weight push is waiting": a counter in a TCP store hosted by the trainer's side, which the rollout ranks read
    between decode steps to stop their in-flight generation early (partial rollouts). One read is one round trip
    (~27 us on one host, measured on the development machine), so it is checked at every step.

    The trainer raises it (:meth:`raise_signal`) while the pool is generating; a call that was started when the
    counter read ``seen`` stops once :meth:`raised_since` ``(seen)`` is true, so a raise is never missed nor left over
    for a later call."""

    KEY = "npu_rl/push_requests"

    def __init__(self, host: str, port: int = 0, *, is_master: bool, timeout_s: float = 600.0):
        self.store = dist.TCPStore(host, int(port), None, is_master, timedelta(seconds=timeout_s),
                                   wait_for_workers=False)
        self.host, self.port = host, self.store.port

    def raise_signal(self) -> int:
        return int(self.store.add(self.KEY, 1))

    def count(self) -> int:
        return int(self.store.add(self.KEY, 0))

    def raised_since(self, seen: int) -> bool:
        return self.count() > seen
