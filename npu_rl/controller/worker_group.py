"""Worker groups: the driver's handle on one or more roles running on every rank.

A group is built from roles, each a class and its constructor arguments (``workers/roles.py`` builds them from the
config and the run settings): ``{"actor_rollout": WorkerSpec(ActorRolloutWorker, (model_cfg, actor_cfg, rollout_cfg,
run_settings)), "critic": WorkerSpec(CriticWorker, (critic_cfg, run_settings))}``. On each rank the roles are instantiated side by
side in one process (colocation is composition: no fused god-object), in the given order. The driver calls a
role's registered methods as plain functions::

    group = LocalWorkerGroup(roles)                       # or RayWorkerGroup(pool, roles)
    group.actor_rollout.init_model(total_steps)           # Dispatch.ALL: every rank's output, in rank order
    out = group.actor_rollout.compute_logprobs(batch)     # Dispatch.DP_SPLIT: rows split over ranks, gathered

With one role, ``group.compute_logprobs(batch)`` works too. Only methods decorated with
:func:`~npu_rl.controller.dispatch.register` can be called, on every backend alike, so a method that works
in-process works on Ray.

:class:`LocalWorkerGroup` is world size 1 in the driver's own process: a call is a direct method call (no copy, no
split), which is what the single-device trainer runs. :class:`~npu_rl.controller.ray_group.RayWorkerGroup` runs
one Ray actor per device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from npu_rl.controller.dispatch import (
    Dispatch,
    DispatchLayout,
    DispatchSpec,
    collect_outputs,
    dispatch_spec,
    pad_rows,
    registered_methods,
    split_inputs,
    trim_rows,
)

CONTROLLERS = ("auto", "local", "ray")  # trainer.controller


def use_ray(controller: str, world_size: int) -> bool:
    """``trainer.controller``: ``ray`` (one Ray actor per device), ``local`` (in this process), or ``auto``: Ray when
    the run has more than one device."""
    if controller == "auto":
        return world_size > 1
    return controller == "ray"


@dataclass
class WorkerSpec:
    """A role's class and constructor arguments (must pickle for Ray: a module-level class)."""

    cls: type
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def build(self) -> Any:
        return self.cls(*self.args, **self.kwargs)


class Pending:
    """The result of a ``blocking=False`` call: ``.get()`` waits for it and returns what a blocking call would."""

    def __init__(self, resolve: Callable[[], Any]):
        self._resolve = resolve
        self._done = False
        self._value = None

    def get(self) -> Any:
        if not self._done:
            self._value, self._done = self._resolve(), True
        return self._value


class RoleHandle:
    """``group.<role>``: attribute access gives the role's registered methods as callables."""

    def __init__(self, group: WorkerGroup, role: str, cls: type):
        self._group, self._role, self._cls = group, role, cls

    def __getattr__(self, name: str) -> Callable:
        spec = dispatch_spec(self._cls, name)
        if spec is None:
            known = sorted(registered_methods(self._cls))
            raise AttributeError(
                f"{self._cls.__name__}.{name} is not a registered worker method (decorate it with "
                f"@register(Dispatch...)); registered: {known}"
            )

        def call(*args, **kwargs):
            return self._group._call(self._role, name, spec, args, kwargs)

        call.__name__ = name
        return call

    def __repr__(self) -> str:
        return f"<role {self._role!r}: {self._cls.__name__} x {self._group.world_size}>"


class WorkerGroup:
    """Backend-independent part: role lookup, splitting and collecting. Backends implement ``_run`` (start the
    call on the ranks that have inputs, return a resolver for the per-rank outputs) and ``_query_layouts``."""

    world_size: int

    def __init__(self, roles: dict[str, WorkerSpec]):
        if not roles:
            raise ValueError("a worker group needs at least one role")
        for role, spec in roles.items():
            if not isinstance(spec, WorkerSpec):
                raise TypeError(f"role {role!r}: expected a WorkerSpec, got {type(spec).__name__}")
        self.roles = dict(roles)
        self._handles = {role: RoleHandle(self, role, spec.cls) for role, spec in roles.items()}
        self._layouts: dict[str, list[DispatchLayout]] = {}

    def __getattr__(self, name: str) -> Any:
        handles = self.__dict__.get("_handles", {})
        if name in handles:
            return handles[name]
        if len(handles) == 1:
            return getattr(next(iter(handles.values())), name)
        raise AttributeError(f"worker group has no role {name!r}; roles: {sorted(handles)}")

    def role_names(self) -> list[str]:
        return list(self.roles)

    def layouts(self, role: str) -> list[DispatchLayout]:
        """Each rank's DP layout for ``role``, asked once (the first DP_SPLIT call) and cached."""
        if role not in self._layouts:
            self._layouts[role] = self._query_layouts(role)
        return self._layouts[role]

    def _call(self, role: str, method: str, spec: DispatchSpec, args: tuple, kwargs: dict) -> Any:
        layouts = self.layouts(role) if spec.mode is Dispatch.DP_SPLIT else None
        rows = None
        if layouts is not None and spec.pad_rows:
            args, kwargs, rows = pad_rows(args, kwargs, layouts[0].dp_size)
        per_rank = split_inputs(spec.mode, self.world_size, layouts, args, kwargs, f"{role}.{method}")
        resolve = self._run(role, method, per_rank)
        pending = Pending(lambda: trim_rows(collect_outputs(spec.mode, layouts, resolve()), rows))
        return pending.get() if spec.blocking else pending

    # ------------------------------------------------------------------ backend hooks
    def _run(self, role: str, method: str, per_rank: list) -> Callable[[], list]:
        raise NotImplementedError

    def _query_layouts(self, role: str) -> list[DispatchLayout]:
        raise NotImplementedError

    def shutdown(self) -> None:
        """Release the workers (a no-op in-process)."""


def layout_of(worker: Any, rank: int, world_size: int) -> DispatchLayout:
    """A worker's own layout if it defines ``dispatch_layout()``, else one data-parallel rank per rank."""
    fn = getattr(worker, "dispatch_layout", None)
    layout = fn() if fn is not None else None
    return layout if layout is not None else DispatchLayout(rank, world_size, True)


class LocalWorkerGroup(WorkerGroup):
    """World size 1, in the driver's process: ``group.role.method(x)`` is ``worker.method(x)``, nothing more."""

    world_size = 1

    def __init__(self, roles: dict[str, WorkerSpec]):
        super().__init__(roles)
        self.workers = {role: spec.build() for role, spec in roles.items()}

    def _call(self, role: str, method: str, spec: DispatchSpec, args: tuple, kwargs: dict) -> Any:
        # One rank: DP_SPLIT's single piece is the whole batch and ALL's list has one element; skip the copies.
        out = getattr(self.workers[role], method)(*args, **kwargs)
        if spec.mode is Dispatch.ALL:
            out = [out]
        return out if spec.blocking else Pending(lambda: out)

    def _query_layouts(self, role: str) -> list[DispatchLayout]:
        return [layout_of(self.workers[role], 0, 1)]

    def worker(self, role: str | None = None) -> Any:
        """The worker object itself (in-process only): for tests and for the single-device trainer."""
        return self.workers[role or next(iter(self.workers))]
