"""Where a training step's rollouts come from: the same devices (sync), or a separate rollout pool (docs/async.md).

The trainer asks ``rollouts.next_rollout()`` for each step's scored-to-be batch and tells ``rollouts.after_update()``
when the policy changed; everything asynchronous lives behind those two calls::

    sync          trainer devices:  [gen k][train k][gen k+1][train k+1]
    one_step_off  rollout pool:     [gen k+1 (weights k-1)][gen k+2 (weights k)]...
                  trainer pool:     [train k          ]push[train k+1        ]push
    fully_async   rollout pool:     gen gen gen gen | push | gen gen gen ...   -> bounded queue ->
                  trainer pool:     take require_batches mini-batches, update; every trigger_parameter_sync_step
                                    updates: push the weights (the rollouter pauses; its in-flight batch finishes,
                                    or with partial_rollout stops at the next decode step and continues after)

Versions: a policy version is the number of trainer updates its weights include; the rollout pool stamps every row
with the version its first token was sampled under (``policy_version``) and that of its last
(``policy_version_end``: later only for a partial rollout continued after a push). A row's staleness is the number
of weight pushes made since its first token's version; fully async drops rows staler than
``ceil(staleness_threshold)`` pushes (counted).
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from typing import Any

import torch

from npu_rl.config.async_schema import staleness_versions, streaming_batch_size
from npu_rl.controller.ray_group import RayWorkerGroup, ResourcePool
from npu_rl.controller.worker_group import WorkerSpec
from npu_rl.device import get_backend
from npu_rl.device.npu_env import worker_process_env
from npu_rl.parallel.weight_transport import PushSignal
from npu_rl.protocol import Batch, WorkerOutput
from npu_rl.rollout.partial import response_lengths, scatter_rows, split_complete_groups
from npu_rl.workers.rollout_pool import RolloutPoolWorker

logger = logging.getLogger(__name__)


class SyncRollouts:
    """The synchronous trainer's rollouts: the actor's colocated engine generates each step's prompts."""

    def __init__(self, prompts, actor_rollout):
        self.prompts, self.actor_rollout = prompts, actor_rollout

    def next_rollout(self) -> tuple[Batch, WorkerOutput]:
        prompts = self.prompts.next_batch()
        return prompts, self.actor_rollout.generate_sequences(prompts)

    def after_update(self) -> dict[str, float]:
        return {}

    @property
    def validator(self):
        return self.actor_rollout

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> dict[str, float]:
        return {}


class RolloutPool:
    """The rollout pool's group and the weight push from the trainer's rank 0 to it."""

    def __init__(self, group, actor_rollout):
        self.group, self.actor_rollout = group, actor_rollout
        # the version the pool holds; -1: not pushed yet (the model folder's weights, or vLLM's dummy load), so the
        # first rollout starts with a push and the pool holds exactly the trainer's weights
        self.pushed_version = -1
        self.pushed: list[int] = []  # every version pushed, in order (staleness counts pushes)
        self.signal = None  # partial rollouts: the push signal the rollout ranks read (enable_interrupts)

    def enable_interrupts(self) -> None:
        """Partial rollouts: host the push signal in this process and connect every rollout rank to it."""
        import ray


        self.signal = PushSignal(ray.util.get_node_ip_address(), 0, is_master=True)
        self.group.rollout.connect_push_signal(self.signal.host, self.signal.port)

    def push(self, version: int) -> dict[str, float]:
        """The trainer's current weights (``version``) into every rollout rank; the pool must be idle or finish
        its current call first (each rank runs one call at a time)."""
        start = time.perf_counter()
        receiving = self.group.rollout.receive_weights(version)  # returns at once; the ranks wait on the group
        sent = self.actor_rollout.send_weights()[0]
        received = receiving.get()
        self.pushed_version = version
        if not self.pushed or self.pushed[-1] != version:  # a resume re-sends the saved version: not a new one
            self.pushed.append(version)
        return sent | {"weight_sync/version": float(version), "timing_s/weight_sync": time.perf_counter() - start,
                       "timing_s/rollout_receive_weights": max(m["timing_s/rollout_receive_weights"]
                                                               for m in received)}

    def pushes_since(self, versions: torch.Tensor) -> torch.Tensor:
        """Per row: how many weight pushes happened after the version it was generated under. [rows] int64"""
        pushed = torch.tensor(self.pushed, dtype=torch.int64)
        return (pushed.unsqueeze(0) > versions.unsqueeze(1)).sum(dim=1)

    def shutdown(self) -> None:
        self.group.shutdown()  # the group owns its devices: they are given back with it


def staleness_metrics(lags: torch.Tensor, prefix: str = "async/staleness") -> dict[str, float]:
    """Histogram of the rows' staleness (fractions per number of pushes behind), mean and max."""
    if lags.numel() == 0:
        return {}
    out = {f"{prefix}/mean": float(lags.float().mean()), f"{prefix}/max": float(lags.max())}
    for value, count in zip(*torch.unique(lags, return_counts=True)):
        out[f"{prefix}/hist_{int(value)}"] = float(count) / lags.numel()
    return out


class OneStepOffRollouts:
    """verl's one-step off-policy: while the trainer updates on batch k, the pool generates batch k+1 with the
    weights before that update; the weights are pushed once per step, when the pool has finished batch k+1."""

    def __init__(self, pool: RolloutPool, prompts):
        self.pool, self.prompts = pool, prompts
        self.updates = 0  # trainer updates so far: the version of the trainer's weights
        self.pending: tuple[Batch, Any] | None = None
        self.dropped_on_resume: int | None = None  # set by a resume, logged with the first step after it

    @property
    def validator(self):
        return _OneStepOffValidator(self)

    def _launch(self) -> None:
        prompts = self.prompts.next_batch()
        self.pending = (prompts, self.pool.group.rollout.generate_ahead(prompts))

    def next_rollout(self) -> tuple[Batch, WorkerOutput]:
        metrics: dict[str, float] = {}
        if self.pending is None:  # the first step (or after a resume): push what the trainer holds, then generate
            if self.pool.pushed_version != self.updates:
                metrics |= self.pool.push(self.updates)
            self._launch()
        prompts, pending = self.pending
        start = time.perf_counter()
        out = pending.get()
        waited = time.perf_counter() - start
        if self.pool.pushed_version != self.updates:
            metrics |= self.pool.push(self.updates)  # the pool is idle now: weights of update k-1 for batch k+1
        self._launch()  # overlaps the update the trainer runs next
        generate_s = out.metrics.get("timing_s/generate_sequences", 0.0)
        lags = self.updates - out.batch["policy_version"]  # in updates; one push per update here
        metrics |= staleness_metrics(lags) | {  # overlap: the share of the generation the trainer did not wait for
            "async/trainer_wait_s": waited,
            "async/overlap_ratio": max(0.0, 1.0 - waited / generate_s) if generate_s > 0 else 0.0,
        }
        if self.dropped_on_resume is not None:
            metrics["async/resume_dropped_samples"] = float(self.dropped_on_resume)
            self.dropped_on_resume = None
        self._step_start, self._waited = start, waited
        return prompts, WorkerOutput(out.batch, out.metrics | metrics)

    def after_update(self) -> dict[str, float]:
        self.updates += 1
        step_s = time.perf_counter() - self._step_start
        return {"trainer/idle_ratio": self._waited / step_s if step_s > 0 else 0.0}

    def state_dict(self) -> dict[str, Any]:
        # the batch being generated is not saved: on resume its prompts are skipped, counted
        in_flight = len(self.pending[0]) if self.pending is not None else 0
        return {"updates": self.updates, "in_flight_prompts": in_flight}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state.get("updates", 0))
        self.dropped_on_resume = int(state.get("in_flight_prompts", 0))
        self.pool.pushed_version = -1  # the pool holds the initial weights: push the loaded ones first
        self.pending = None

    def close(self) -> dict[str, float]:
        dropped = 0
        try:
            if self.pending is not None:  # let the pool finish the batch it is on (clean shutdown of its ranks)
                dropped = len(self.pending[0])
                pending, self.pending = self.pending[1], None
                pending.get()
        finally:  # a rank lost while generating still leaves the others to stop
            self.pool.shutdown()
        return {"async/dropped_samples_at_exit": float(dropped)}


class SampleQueue:
    """A bounded FIFO of generated batches (``rollout.n`` rows per prompt), counted in prompts."""

    def __init__(self, capacity_prompts: int, rows_per_prompt: int):
        self.capacity, self.n = capacity_prompts, rows_per_prompt
        self.items: collections.deque[Batch] = collections.deque()
        self.cond = threading.Condition()
        self.closed = False

    @property
    def num_prompts(self) -> int:
        return sum(len(b) for b in self.items) // self.n

    def put(self, batch: Batch) -> None:
        with self.cond:
            while self.num_prompts + len(batch) // self.n > self.capacity and not self.closed:
                self.cond.wait()
            self.items.append(batch)
            self.cond.notify_all()

    def take(self, num_prompts: int) -> Batch | None:
        """``num_prompts`` prompts' rows (a batch split when needed); None once closed and empty."""
        rows, taken = num_prompts * self.n, []
        with self.cond:
            while sum(len(b) for b in taken) < rows:
                while not self.items and not self.closed:
                    self.cond.wait()
                if not self.items:
                    return None
                head = self.items.popleft()
                need = rows - sum(len(b) for b in taken)
                if len(head) > need:
                    self.items.appendleft(head.index(slice(need, len(head))))
                    head = head.index(slice(0, need))
                taken.append(head)
            self.cond.notify_all()
        return Batch.concat(taken)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


class StreamingRollouts:
    """verl's fully asynchronous trainer: a rollouter thread keeps the pool generating into a bounded queue, at most
    ``(1 + staleness_threshold) x K`` prompts per policy version (K = trigger_parameter_sync_step x require_batches
    x ppo_mini_batch_size); the trainer takes ``require_batches`` mini-batches per update and pushes its weights
    every ``trigger_parameter_sync_step`` updates."""

    def __init__(self, pool: RolloutPool, prompts, config):
        at = config.async_training
        self.pool, self.prompts = pool, prompts
        self.n = int(config.actor_rollout_ref.rollout.n)
        self.take_prompts = streaming_batch_size(config)
        self.trigger = int(at.trigger_parameter_sync_step)
        self.per_version = int(math.floor((1 + at.staleness_threshold) * self.trigger * self.take_prompts))
        self.max_lag = staleness_versions(at.staleness_threshold)
        self.pool_ranks = int(config.rollout.nnodes) * int(config.rollout.n_gpus_per_node)
        total = config.rollout.total_rollout_steps
        self.prompts_left = int(total) if total is not None else None
        self.queue = SampleQueue(self.per_version + self.take_prompts, self.n)
        self.updates = 0
        self.budget = self.per_version  # prompts the rollouter may still start under the current version
        self.pausing = False
        self.in_flight = 0
        self.unqueued = 0  # prompts taken from the stream and not in the queue yet (generating, or being put)
        self.cond = threading.Condition()
        self.stop = False
        self.error: BaseException | None = None
        self.counts = collections.Counter()
        self.rollout_idle_s = 0.0
        self.clock = time.perf_counter()
        self.dropped_on_resume: int | None = None  # set by a resume, logged with the first step after it
        self.thread: threading.Thread | None = None
        # partial rollouts: the groups of rows an interrupt left unfinished (continued first after the push), and
        # the push signal's count as this side last raised it
        self.partial_rollout = bool(at.partial_rollout)
        self.held: Batch | None = None
        self.signals = 0

    @property
    def validator(self):
        return _PausedValidator(self)

    @property
    def held_prompts(self) -> int:
        return len(self.held) // self.n if self.held is not None else 0

    # ------------------------------------------------------------------------------------ the rollouter thread
    def _start(self) -> None:
        """The first rollout (or the first after a resume): the pool takes the trainer's weights, then the rollouter
        starts. Later pushes are ``_push``'s, every trigger_parameter_sync_step updates."""
        if self.thread is not None:
            return
        if self.partial_rollout and self.pool.signal is None:
            self.pool.enable_interrupts()
        if self.pool.pushed_version != self.updates:
            self._first_push = self.pool.push(self.updates)
        self.thread = threading.Thread(target=self._rollouter, name="npu_rl-rollouter", daemon=True)
        self.thread.start()

    def _gen_prompts(self) -> Batch:
        """The next generation batch: whole loader batches until the pool's ranks each get the same count."""
        parts = [self.prompts.next_batch()]
        while sum(len(p) for p in parts) % self.pool_ranks:
            parts.append(self.prompts.next_batch())
        return Batch.concat(parts) if len(parts) > 1 else parts[0]

    def _rollouter(self) -> None:
        try:
            while True:
                idle_from = time.perf_counter()
                with self.cond:
                    while not self.stop and (self.pausing or (self.held is None and (
                            self.budget <= 0 or self.prompts_left == 0))):
                        self.cond.wait()
                    if self.stop:
                        return
                    held, self.held = self.held, None  # partial rollouts: finish what was interrupted first
                    if held is None:
                        prompts = self._gen_prompts()
                        if self.prompts_left is not None:
                            prompts = prompts.index(slice(0, min(len(prompts), self.prompts_left)))
                            self.prompts_left -= len(prompts)
                        self.budget -= len(prompts)
                        self.in_flight = len(prompts)
                    else:
                        self.in_flight = len(held) // self.n
                    self.unqueued = self.in_flight
                    signals = self.signals
                self.rollout_idle_s += time.perf_counter() - idle_from
                if held is not None:
                    batch = self._continue(held, signals)
                elif self.partial_rollout:
                    batch = self.pool.group.rollout.generate_sequences(prompts, interrupt_after=signals).batch
                else:
                    batch = self.pool.group.rollout.generate_sequences(prompts).batch
                if self.partial_rollout:
                    batch, unfinished = split_complete_groups(batch, self.n)
                    batch.pop("unfinished")
                with self.cond:
                    self.in_flight = 0
                    if self.partial_rollout and len(unfinished):
                        self.held = unfinished
                    self.unqueued = len(batch) // self.n  # the held rows are counted as held
                    self.counts["generated_prompts"] += len(batch) // self.n
                    self.cond.notify_all()
                if len(batch):
                    self.queue.put(batch)
                with self.cond:
                    self.unqueued = 0
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer's thread, which raises it
            self.error = exc
            self.queue.close()

    def _continue(self, held: Batch, signals: int) -> Batch:
        """Partial rollouts: continue the unfinished rows of the held groups on the pool's current weights (split over
        its ranks: padded to a multiple of them with copies of the last row, which are then dropped)."""
        index = torch.nonzero(held["unfinished"].bool()).squeeze(1)
        rows = held.index(index)
        pad = -len(rows) % self.pool_ranks
        padded = Batch.concat([rows] + [rows.index([len(rows) - 1])] * pad) if pad else rows
        continued = self.pool.group.rollout.continue_sequences(padded, interrupt_after=signals).batch
        continued = continued.index(slice(0, len(rows)))
        with self.cond:
            self.counts["resumed_rows"] += len(rows)
            self.counts["kept_tokens"] += int(response_lengths(rows).sum())
        return scatter_rows(held, index, continued)

    # ------------------------------------------------------------------------------------ the trainer's side
    def next_rollout(self) -> tuple[Batch, WorkerOutput]:
        self._first_push: dict[str, float] = {}
        self._start()
        metrics: dict[str, float] = dict(self._first_push)
        kept: list[Batch] = []
        need, waited = self.take_prompts, 0.0
        while need > 0:
            start = time.perf_counter()
            batch = self.queue.take(need)
            waited += time.perf_counter() - start
            if batch is None:
                raise self.error if self.error is not None else RuntimeError(
                    "fully async: the rollout pool has no prompts left (rollout.total_rollout_steps reached before "
                    "trainer.total_training_steps)")
            lags = self.pool.pushes_since(batch["policy_version"])  # the age of a row's oldest token
            fresh = lags <= self.max_lag
            if not bool(fresh.all()):
                self.counts["dropped_samples"] += int((~fresh).sum())
                batch, lags = batch.index(torch.nonzero(fresh).squeeze(1)), lags[fresh]
            need -= len(batch) // self.n
            if len(batch):
                kept.append(batch)
                self.counts["stale_trajectories"] += int((lags > 0).sum())
                metrics |= staleness_metrics(lags)
        batch = Batch.concat(kept)
        metrics |= self._partial_metrics(batch)
        self._waited = waited
        self._step_start = time.perf_counter() - waited
        metrics |= {
            "async/queue_depth_prompts": float(self.queue.num_prompts),
            "async/trainer_wait_s": waited,
            "async/dropped_samples": float(self.counts["dropped_samples"]),
            "fully_async/count/stale_trajectory_processed": float(self.counts["stale_trajectories"]),
            "fully_async/count/stale_samples_processed": float(self.counts["stale_trajectories"] // self.n),
        }
        if self.dropped_on_resume is not None:
            metrics["async/resume_dropped_samples"] = float(self.dropped_on_resume)
            self.dropped_on_resume = None
        prompts = batch.index(slice(0, len(batch), self.n))
        return prompts, WorkerOutput(batch, metrics)

    def _partial_metrics(self, batch: Batch) -> dict[str, float]:
        """verl's ``fully_async/partial/*`` over the step's rows (a row generated across pushes is partial; its span
        is the number of pushes between its first and last token) and the rollouter's partial counts so far."""
        if not self.partial_rollout or not len(batch):
            return {}
        since_start = self.pool.pushes_since(batch["policy_version"])
        since_end = self.pool.pushes_since(batch["policy_version_end"])
        span = since_start - since_end
        return staleness_metrics(since_end, "async/staleness_end") | {
            "fully_async/partial/total_partial_num": float((span > 0).sum()),
            "fully_async/partial/partial_ratio": float((span > 0).float().mean()),
            "fully_async/partial/max_partial_span": float(span.max()),
            "async/partial/resumed_samples": float(self.counts["resumed_rows"]),
            "async/partial/kept_tokens": float(self.counts["kept_tokens"]),
            "async/partial/interrupted_pushes": float(self.counts["interrupted_pushes"]),
        }

    def after_update(self) -> dict[str, float]:
        self.updates += 1
        now = time.perf_counter()
        step_s = now - self._step_start
        metrics = {"trainer/idle_ratio": self._waited / step_s if step_s > 0 else 0.0}
        if self.updates % self.trigger == 0:
            metrics |= self._push()
        elapsed = now - self.clock
        metrics["rollouter/idle_ratio"] = min(1.0, self.rollout_idle_s / elapsed) if elapsed > 0 else 0.0
        self.rollout_idle_s, self.clock = 0.0, now
        return metrics

    def _pause(self) -> float:
        """Hold the rollouter and wait until the pool is idle: its in-flight call finishes, or with partial rollouts
        stops at the next decode step (the push signal). Returns the seconds waited."""
        start = time.perf_counter()
        with self.cond:
            self.pausing = True
            if self.partial_rollout and self.in_flight:
                self.signals = self.pool.signal.raise_signal()
                self.counts["interrupted_pushes"] += 1
            while self.in_flight and self.error is None:
                self.cond.wait()
        return time.perf_counter() - start

    def _push(self) -> dict[str, float]:
        """Pause the rollouter (:meth:`_pause`), push, then a new budget."""
        paused_s = self._pause()
        try:
            metrics = self.pool.push(self.updates)
        finally:
            with self.cond:
                # what the queue holds, and the interrupted prompts continued next, were started under the old
                # version: they count against the new budget (verl: staleness_samples = active tasks + queue)
                self.budget = self.per_version - self.queue.num_prompts - self.held_prompts
                self.pausing = False
                self.cond.notify_all()
        return metrics | {"async/push_wait_in_flight_s": paused_s}

    def state_dict(self) -> dict[str, Any]:
        # one snapshot under the rollouter's lock: the prompt stream's position and what was taken from it but not
        # trained on (queued, generating) agree, so a resume skips exactly the prompts it counts as dropped
        with self.cond:
            return {"updates": self.updates, "pushed": list(self.pool.pushed),
                    "queued_prompts": self.queue.num_prompts + self.unqueued + self.held_prompts,
                    "prompts_left": self.prompts_left, "prompts": self.prompts.state_dict(),
                    "counts": dict(self.counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The queue is not saved: its prompts are dropped, counted, and the pool takes the loaded weights."""
        self.updates = int(state.get("updates", 0))
        self.dropped_on_resume = int(state.get("queued_prompts", 0))
        self.prompts_left = state.get("prompts_left", self.prompts_left)
        if "prompts" in state:  # the position taken with the queue's count (the trainer's own may be a batch off)
            self.prompts.load_state_dict(state["prompts"])
        self.counts = collections.Counter({k: int(v) for k, v in state.get("counts", {}).items()})
        self.pool.pushed = [int(v) for v in state.get("pushed", [])]
        self.pool.pushed_version = -1  # the pool holds the initial weights: _start pushes the loaded ones

    def close(self) -> dict[str, float]:
        """Stop the rollouter after its in-flight batch (Ctrl-C drains cleanly), then release the pool."""
        with self.cond:
            self.stop = True
            self.cond.notify_all()
        self.queue.close()
        if self.thread is not None:
            self.thread.join()
        left = self.queue.num_prompts + self.held_prompts
        self.pool.shutdown()
        return {"async/dropped_samples_at_exit": float(left)}


class _OneStepOffValidator:
    """Validation on the rollout pool. Before the first push (and after a resume) the pool holds the model folder's
    weights, or none (vLLM's ``load_format=dummy``): the trainer's weights are pushed first. During training the
    pool's weights are one update behind the trainer's, as its rollouts are, and validation waits for the batch it
    is generating."""

    def __init__(self, rollouts: OneStepOffRollouts):
        self.rollouts = rollouts

    def generate_sequences(self, prompts: Batch, validate: bool = False) -> WorkerOutput:
        r = self.rollouts
        if r.pending is None and r.pool.pushed_version != r.updates:
            r.pool.push(r.updates)
        return r.pool.group.rollout.generate_sequences(prompts, validate=validate)


class _PausedValidator:
    """Validation on the rollout pool (with the last pushed weights) while the rollouter is paused."""

    def __init__(self, rollouts: StreamingRollouts):
        self.rollouts = rollouts

    def generate_sequences(self, prompts: Batch, validate: bool = False) -> WorkerOutput:
        r = self.rollouts
        r._pause()
        try:
            if r.pool.pushed_version < 0:  # before the first push (or after a resume): the trainer's weights first
                r.pool.push(r.updates)
            return r.pool.group.rollout.generate_sequences(prompts, validate=validate)
        finally:
            with r.cond:
                r.pausing = False
                r.cond.notify_all()


def build_rollouts(config, run_settings, group, prompts):
    """The rollouts for ``config.async_training.mode``: the trainer's own engine (sync), or a rollout pool of
    ``rollout.nnodes x rollout.n_gpus_per_node`` Ray actors joined to the trainer's rank 0 by a weight group."""
    mode = config.async_training.mode
    if mode == "sync":
        return SyncRollouts(prompts, group.actor_rollout)
    import dataclasses
    import socket

    import ray


    if not ray.is_initialized():
        init = config.ray_kwargs.ray_init
        ray.init(**{k: v for k, v in dataclasses.asdict(init).items() if v not in (None, {})})
    arr = config.actor_rollout_ref
    pool_devices = ResourcePool([config.rollout.n_gpus_per_node] * config.rollout.nnodes, name="rollout")
    roles = {"rollout": WorkerSpec(RolloutPoolWorker, (arr.model, arr.rollout, run_settings))}
    backend = get_backend()
    rollout_group = RayWorkerGroup(pool_devices, roles, name="npu_rl_rollout", owns_pool=True,
                                   process_env=worker_process_env(backend.name, sleep_mode=False))
    try:
        rollout_group.rollout.init_model()
        if hasattr(group, "rank0_address"):
            host, port = group.rank0_address()
        else:  # the local controller: the trainer's rank 0 is this process
            host = ray.util.get_node_ip_address()
            with socket.socket() as sock:
                sock.bind(("", 0))
                port = sock.getsockname()[1]
        world = 1 + pool_devices.world_size
        joining = rollout_group.rollout.join_weight_group(backend.dist_backend, host, port, world)
        group.actor_rollout.join_weight_group(backend.dist_backend, host, port, world)
        joining.get()
    except BaseException:
        rollout_group.shutdown()  # and its devices (the trainer's own groups are the caller's to stop)
        raise
    pool = RolloutPool(rollout_group, group.actor_rollout)
    logger.info("rollout pool: %d rank(s), weight group of %d over %s", pool_devices.world_size, world,
                backend.dist_backend)
    if mode == "one_step_off":
        return OneStepOffRollouts(pool, prompts)
    return StreamingRollouts(pool, prompts, config)
