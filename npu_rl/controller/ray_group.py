"""The Ray backend: one actor per device, placed by placement groups, one per node.

- :class:`ResourcePool` reserves ``processes_per_node[i]`` bundles on node ``i``, each bundle one device (the Ray
  resource the device layer names: ``NPU`` / ``GPU``; none on CPU) plus ``cpus_per_worker`` CPUs. Roles that share
  devices go into one group on one pool (colocation is composition: each actor holds every role's worker);
  roles on separate devices get separate pools (e.g. the critic on its own nodes).
- :class:`RayWorkerGroup` starts the actors (a :class:`WorkerHost` each), then sets ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` (rank 0's node, a free port there) and the
  device's visible-devices variable in each, initialises torch.distributed with the device layer's backend, and
  only then builds the workers, in role order. Workers never import Ray.

Ray is imported here only, and only when a RayWorkerGroup is built.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Callable

import torch

from npu_rl.controller.dispatch import DispatchLayout
from npu_rl.controller.worker_group import WorkerGroup, WorkerSpec, layout_of
from npu_rl.device import get_backend
from npu_rl.parallel.dist import init_distributed
from npu_rl.protocol import Batch

_RAY_NATIVE_RESOURCES = {"GPU": "num_gpus"}  # Ray refuses these names inside `resources=`


class WorkerLostError(RuntimeError):
    """A worker actor died (its process crashed, or its node went away): the step in progress cannot finish."""


def _first_lines(exc: BaseException) -> str:
    """Ray's own account of the death, without its traceback: the lines naming the actor and why it died."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    keep = [line for line in lines if line.startswith(("The actor died", "ip:", "name:", "the actor's node"))]
    return "; ".join(keep or lines[:3])


def _dead_rank(refs: list, timeout_s: float = 60.0):
    """The RayActorError of a rank whose actor died, waiting up to ``timeout_s`` in all for Ray to notice; None when
    every rank is alive (the task failed on its own)."""
    import ray

    deadline = time.monotonic() + timeout_s
    for ref in refs:
        if ref is None:
            continue
        try:
            ray.get(ref, timeout=max(deadline - time.monotonic(), 0.1))
        except ray.exceptions.RayActorError as exc:
            return exc
        except Exception:  # noqa: BLE001 - this rank's own failure or timeout: look at the next rank
            continue
    return None


class ResourcePool:
    """Devices reserved for one worker group: a placement group per node (``STRICT_PACK``).

    ``resource`` is the Ray resource name of one device; ``"auto"`` asks the device layer (``NPU``, ``GPU``, or
    None on CPU, where bundles hold CPUs only: what the tests use).
    """

    def __init__(self, processes_per_node: list[int], *, resource: str | None = "auto", cpus_per_worker: float = 1,
                 name: str = "npu_rl", ready_timeout_s: float = 300.0):
        if not processes_per_node or any(n < 1 for n in processes_per_node):
            raise ValueError(f"processes_per_node must list positive counts, got {processes_per_node}")
        if resource == "auto":
            resource = get_backend().ray_resource
        self.processes_per_node = list(processes_per_node)
        self.resource = resource
        self.cpus_per_worker = cpus_per_worker
        self.name = name
        self.ready_timeout_s = ready_timeout_s
        self._placement_groups: list | None = None

    @classmethod
    def from_trainer_config(cls, nnodes: int, n_gpus_per_node: int, **kwargs) -> ResourcePool:
        """``trainer.nnodes`` x ``trainer.n_gpus_per_node`` devices."""
        return cls([n_gpus_per_node] * nnodes, **kwargs)

    @property
    def world_size(self) -> int:
        return sum(self.processes_per_node)

    def bundle(self) -> dict[str, float]:
        bundle = {"CPU": self.cpus_per_worker}
        if self.resource:
            bundle[self.resource] = 1
        return bundle

    def placement_groups(self) -> list:
        """Created (and waited for) on first use, ordered by node IP so ranks are stable across runs."""
        if self._placement_groups is None:
            import ray
            from ray.util.placement_group import placement_group

            pgs = [placement_group([self.bundle()] * n, strategy="STRICT_PACK", name=f"{self.name}_{i}")
                   for i, n in enumerate(self.processes_per_node)]
            ready, _ = ray.wait([pg.ready() for pg in pgs], num_returns=len(pgs), timeout=self.ready_timeout_s)
            if len(ready) < len(pgs):
                for pg in pgs:
                    ray.util.remove_placement_group(pg)
                raise RuntimeError(
                    f"resource pool {self.name!r}: could not reserve {self.processes_per_node} x {self.bundle()} "
                    f"within {self.ready_timeout_s:.0f}s; the cluster has {ray.available_resources()}"
                )
            self._placement_groups = _sort_by_node_ip(pgs)
        return self._placement_groups

    def remove(self) -> None:
        if self._placement_groups is not None:
            import ray

            for pg in self._placement_groups:
                ray.util.remove_placement_group(pg)
            self._placement_groups = None


def _sort_by_node_ip(pgs: list) -> list:
    import ray
    from ray.util import placement_group_table

    ip_of = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    keyed = []
    for index, pg in enumerate(pgs):
        node_id = placement_group_table(pg)["bundles_to_node_id"][0]
        keyed.append((ip_of.get(node_id, ""), index, pg))
    return [pg for _, _, pg in sorted(keyed, key=lambda item: (item[0], item[1]))]


class WorkerHost:
    """What runs inside each Ray actor: sets the process up as one rank, then holds the roles' workers."""

    def __init__(self, rank: int, world_size: int, local_rank: int, local_world_size: int, device: str,
                 resource: str | None):
        self.rank, self.world_size = rank, world_size
        self.local_rank, self.local_world_size = local_rank, local_world_size
        self.device, self.resource = device, resource
        self.workers: dict[str, Any] = {}

    def master_address(self) -> tuple[str, int]:
        """This node's IP and a port free on it now (for rank 0)."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def setup(self, master_addr: str, master_port: int, roles: dict[str, WorkerSpec], env: dict[str, str],
              seed: int | None = None) -> None:
        os.environ.update({k: str(v) for k, v in env.items()})
        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(self.local_rank),
                          LOCAL_WORLD_SIZE=str(self.local_world_size), MASTER_ADDR=master_addr,
                          MASTER_PORT=str(master_port))
        backend = get_backend(self.device)
        init_distributed(backend, device_index=self._claim_device(backend))
        if seed is not None:  # as the local controller's processes are seeded before their workers are built
            backend.manual_seed(seed)
        self.workers = {role: spec.build() for role, spec in roles.items()}

    def _claim_device(self, backend) -> int | None:
        """Make this actor's device the visible one and return its index in the visible list.

        Ray already narrows the visible-devices variable to the actor's device unless
        ``RAY_EXPERIMENTAL_NOSET_<VAR>`` is set; then every device stays visible and we select ours by its id.
        """
        if not (self.resource and backend.visible_devices_env):
            return None
        import ray

        ids = [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get(self.resource, [])]
        if not ids:
            raise RuntimeError(f"rank {self.rank} holds no {self.resource} although its bundle asks for one")
        var = backend.visible_devices_env
        if os.environ.get(f"RAY_EXPERIMENTAL_NOSET_{var}"):
            visible = os.environ.get(var)
            return visible.split(",").index(ids[0]) if visible else int(ids[0])
        os.environ[var] = ",".join(ids)
        return 0

    def execute(self, role: str, method: str, /, *args, **kwargs) -> Any:
        return getattr(self.workers[role], method)(*args, **kwargs)

    def layout(self, role: str) -> DispatchLayout:
        return layout_of(self.workers[role], self.rank, self.world_size)


class RayWorkerGroup(WorkerGroup):
    """``roles`` on every bundle of ``pool``: rank ``r`` is bundle ``r`` (nodes in IP order). ``env`` is extra
    environment set in the actors once they run; ``process_env`` is environment the actor processes must *start*
    with (Ray's runtime environment), e.g. ``TASK_QUEUE_ENABLE``, read by torch_npu at import
    (``npu_rl.device.npu_env.worker_process_env``). ``seed`` seeds every actor's Python, NumPy, torch and device
    generators before its workers are built (``trainer.seed``, as the local controller seeds its processes).
    ``owns_pool``: the group gives the pool's devices back (removes its placement groups) when it shuts down, and
    when its start fails; a later run in the same process needs them again. ``ray.init`` must have been called."""

    def __init__(self, pool: ResourcePool, roles: dict[str, WorkerSpec], *, env: dict[str, str] | None = None,
                 device: str | None = None, name: str = "npu_rl", process_env: dict[str, str] | None = None,
                 seed: int | None = None, owns_pool: bool = False):
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


        super().__init__(roles)
        if not ray.is_initialized():
            raise RuntimeError("RayWorkerGroup needs a running Ray: call ray.init(**ray_kwargs.ray_init) first")
        device = device or get_backend().name
        self.world_size = pool.world_size
        self.pool, self.owns_pool = pool, owns_pool
        host_cls = ray.remote(WorkerHost)
        self._hosts = []
        try:
            for pg, count in zip(pool.placement_groups(), pool.processes_per_node):
                for local_rank in range(count):
                    options = _actor_resources(pool)
                    if process_env:
                        options["runtime_env"] = {"env_vars": dict(process_env)}
                    options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                        placement_group=pg, placement_group_bundle_index=local_rank)
                    options["name"] = f"{name}_{pool.name}_rank{len(self._hosts)}_{os.getpid()}_{id(self):x}"
                    self._hosts.append(host_cls.options(**options).remote(
                        len(self._hosts), self.world_size, local_rank, count, device, pool.resource))
            master_addr, master_port = ray.get(self._hosts[0].master_address.remote())
            ray.get([h.setup.remote(master_addr, master_port, self.roles, dict(env or {}), seed) for h in self._hosts])
        except BaseException:  # Ctrl-C during a long start too
            self.shutdown()  # a worker failed to start: don't leave the others holding devices
            raise

    def _run(self, role: str, method: str, per_rank: list) -> Callable[[], list]:
        import ray

        stored: dict[int, Any] = {}  # one ray.put per distinct object: sp ranks and ALL share their inputs

        def put(value):
            if isinstance(value, (Batch, torch.Tensor)):
                if id(value) not in stored:
                    stored[id(value)] = ray.put(value)
                return stored[id(value)]
            return value

        refs = []
        for host, inputs in zip(self._hosts, per_rank):
            if inputs is None:
                refs.append(None)
                continue
            args, kwargs = inputs
            refs.append(host.execute.remote(role, method, *[put(a) for a in args],
                                            **{k: put(v) for k, v in kwargs.items()}))

        def resolve() -> list:
            try:
                values = iter(ray.get([r for r in refs if r is not None]))
            except ray.exceptions.RayActorError as exc:  # a rank's process or its whole node is gone
                raise WorkerLostError(f"a Ray worker died while running {role}.{method}: "
                                      f"{_first_lines(exc)}") from exc
            except ray.exceptions.RayTaskError:
                # A surviving rank's collective fails as soon as its peer is gone ("Connection closed by peer"),
                # often before Ray has marked the dead rank's actor: the death is the cause, said as such.
                dead = _dead_rank(refs)
                if dead is None:
                    raise
                raise WorkerLostError(f"a Ray worker died while running {role}.{method}: "
                                      f"{_first_lines(dead)}") from dead
            return [None if r is None else next(values) for r in refs]

        return resolve

    def rank0_address(self) -> tuple[str, int]:
        """Rank 0's node IP and a port free there: where a process group spanning this group and another meets."""
        import ray

        return ray.get(self._hosts[0].master_address.remote())

    def _query_layouts(self, role: str) -> list[DispatchLayout]:
        import ray

        return ray.get([h.layout.remote(role) for h in self._hosts])

    def shutdown(self) -> None:
        """Kill every rank's actor (its process and the workers in it); with ``owns_pool``, then give the pool's
        devices back. Safe to call twice."""
        import ray

        hosts, self._hosts = self._hosts, []
        try:
            for host in hosts:
                ray.kill(host)
        finally:
            if self.owns_pool:
                self.pool.remove()


def _actor_resources(pool: ResourcePool) -> dict[str, Any]:
    options: dict[str, Any] = {"num_cpus": pool.cpus_per_worker}
    if pool.resource in _RAY_NATIVE_RESOURCES:
        options[_RAY_NATIVE_RESOURCES[pool.resource]] = 1
    elif pool.resource:
        options["resources"] = {pool.resource: 1}
    return options
