"""Single controller: worker methods declare how their inputs are split and outputs gathered
(:mod:`~npu_rl.controller.dispatch`); a worker group runs roles in-process (:class:`LocalWorkerGroup`) or as one Ray
actor per device (:class:`RayWorkerGroup`, Ray imported only when one is built). See docs/distributed.md."""

from npu_rl.controller.dispatch import Dispatch, DispatchLayout, register
from npu_rl.controller.ray_group import RayWorkerGroup, ResourcePool
from npu_rl.controller.worker_group import LocalWorkerGroup, Pending, WorkerGroup, WorkerSpec

__all__ = [
    "Dispatch",
    "DispatchLayout",
    "LocalWorkerGroup",
    "Pending",
    "RayWorkerGroup",
    "ResourcePool",
    "WorkerGroup",
    "WorkerSpec",
    "register",
]
