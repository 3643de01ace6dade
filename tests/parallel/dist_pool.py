"""A pool of N spawned processes forming one gloo process group, kept for the whole test session.

``pool.run(fn, *args)`` runs the module-level function ``fn`` on every rank at once and returns the per-rank
results (rank order). Spawning and importing torch + transformers costs seconds, so the pools are shared by all
distributed tests (``dist_pool2`` / ``dist_pool1`` fixtures in tests/conftest.py). A failure on any rank raises here
with that rank's traceback; the pool is then restarted on next use, since the other ranks may be stuck in a
collective.
"""

from __future__ import annotations

import io
import os
import queue
import socket
import traceback

import torch
import torch.multiprocessing as mp


def _dumps(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _loads(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=False)


def _worker(rank: int, world_size: int, port: int, tasks, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank), DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    torch.set_num_threads(1)
    from npu_rl.parallel.dist import init_distributed

    init_distributed(timeout_s=90)
    while True:
        job = tasks.get()
        if job is None:
            break
        fn, args, kwargs = job
        try:
            results.put((rank, True, _dumps(fn(*args, **kwargs))))
        except BaseException:  # report everything, keep serving
            results.put((rank, False, traceback.format_exc()))
    # Asked to stop (close), every result of this rank was already read by the parent, so nothing is left to flush:
    # leaving without the interpreter's teardown of torch, transformers and the gloo group takes 1-3 s less a pool.
    os._exit(0)


class DistPool:
    def __init__(self, world_size: int, timeout_s: float = 240.0):
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._procs: list = []

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self._tasks = [ctx.Queue() for _ in range(self.world_size)]
        self._results = ctx.Queue()
        self._procs = [ctx.Process(target=_worker, args=(r, self.world_size, port, self._tasks[r], self._results),
                                   daemon=True) for r in range(self.world_size)]
        for proc in self._procs:
            proc.start()

    def run(self, fn, *args, **kwargs) -> list:
        if not self._procs or not all(p.is_alive() for p in self._procs):
            self.close()
            self._start()
        for q in self._tasks:
            q.put((fn, args, kwargs))
        outputs, errors = [None] * self.world_size, []
        try:
            for _ in range(self.world_size):
                rank, ok, payload = self._results.get(timeout=self.timeout_s)
                if ok:
                    outputs[rank] = _loads(payload)
                else:
                    errors.append(f"--- rank {rank} ---\n{payload}")
                    break  # the others may be stuck in a collective
        except queue.Empty:
            errors.append(f"timed out after {self.timeout_s:.0f}s")
        if errors:
            self.close()
            raise AssertionError(f"{getattr(fn, '__name__', fn)} failed:\n" + "\n".join(errors))
        return outputs

    def close(self) -> None:
        for q in getattr(self, "_tasks", []):
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        for proc in self._procs:
            proc.join(timeout=3)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=3)
        self._procs = []
