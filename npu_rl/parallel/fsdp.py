"""FSDP2 (``fully_shard``) for a Hugging Face causal LM or value model, applied after the model is built.

:func:`apply_fsdp2` shards each decoder layer (the classes HF lists in ``model._no_split_modules``) as its own
group, then the root, which holds what is left: embeddings, final norm, LM / value head. Tied embeddings
(``tie_word_embeddings``) are one parameter that lives in the root group, so they stay tied.

Options (:class:`FSDPSettings`, read from ``fsdp_config`` by :meth:`FSDPSettings.from_config`):

- mixed precision: ``MixedPrecisionPolicy(param_dtype, reduce_dtype)`` from ``mixed_precision.param_dtype`` /
  ``reduce_dtype``; the master weights keep the dtype the model was loaded in (``model_dtype``). FSDP2 has no
  buffer dtype: buffers (rotary frequencies) stay as loaded, so ``buffer_dtype`` is ignored.
- ``wrap_policy``: FSDP2 groups by decoder layer, so ``min_num_params`` is not used.
- ``reshard_after_forward``: free the gathered parameters after forward (re-gather in backward).
- ``forward_prefetch``: each layer explicitly prefetches the next layer's all-gather
  (``set_modules_to_forward_prefetch``), issued earlier from the CPU.
- ``param_offload`` (or ``offload_policy``): ``CPUOffloadPolicy``: sharded parameters, gradients and so the
  optimizer step and its states live in host memory; FSDP copies each layer to the device for compute.
- ``optimizer_offload``: optimizer states stay in host memory between steps. Choice: *offload/onload around the
  step* (:func:`optimizer_step` moves the states to the device, steps there, moves them back), so the step itself
  runs at device speed and the states only occupy device memory during the step. Costs two host<->device copies of
  the states per step. With ``param_offload`` the states are already on the host and nothing moves.

Gradient reduction with Ulysses: the FSDP mesh spans all dp x sp ranks, and the sp ranks of a group each hold the
gradient of *their part* of the same sequences, so the right reduction is a sum over sp and a mean over dp: we set
the divide factor to ``dp_size`` (instead of FSDP's default ``dp * sp``) and force plain-sum collectives, as gloo
and HCCL have no PreMulSum.

Expert parallelism (``mesh.ep_mesh``, ``fsdp_config.expert_parallel_size`` > 1): the experts modules are split
over the ep ranks first (:func:`npu_rl.parallel.expert_parallel.apply_expert_parallel`), then each is sharded as
its own group over ``efsdp_mesh`` on dim 1 (``[E, 2I, H]`` cut along ``2I``: a contiguous block per rank whatever
``E / ep`` is, so the sharded loader reads plain slices), before its decoder layer. An expert's gradient already
sums every rank's tokens (the all-to-all brought them), so its divide factor is ``dp_size`` too.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from npu_rl.config.engine_schema import RefFSDPConfig
from npu_rl.device import get_backend
from npu_rl.parallel.expert_parallel import apply_expert_parallel
from npu_rl.parallel.mesh import ParallelMesh, build_mesh
from npu_rl.utils.dtypes import to_dtype
STRATEGIES = ("fsdp", "fsdp2")  # the roles' strategy: both mean FSDP2 (fully_shard) here


def _dtype(value: str | torch.dtype | None) -> torch.dtype | None:
    return None if value is None else to_dtype(value)


@dataclass
class FSDPSettings:
    param_dtype: torch.dtype | None = None  # compute dtype of gathered params; None: keep the master dtype
    reduce_dtype: torch.dtype | None = None  # gradient reduce-scatter dtype; None: the param dtype
    reshard_after_forward: bool = True
    forward_prefetch: bool = False
    param_offload: bool = False
    optimizer_offload: bool = False

    @classmethod
    def from_config(cls, fsdp_config: Any) -> FSDPSettings:
        """From an ``fsdp_config`` node (actor, critic or ref: the schema's FSDPConfig / RefFSDPConfig). The
        reference's ``optimizer_offload`` / ``offload_policy`` are verl keys with no effect here (docstrings)."""
        mp = fsdp_config.mixed_precision
        ref = isinstance(fsdp_config, RefFSDPConfig)
        return cls(
            param_dtype=_dtype(mp.param_dtype),
            reduce_dtype=_dtype(mp.reduce_dtype),
            reshard_after_forward=bool(fsdp_config.reshard_after_forward),
            forward_prefetch=bool(fsdp_config.forward_prefetch),
            param_offload=bool(fsdp_config.param_offload or (fsdp_config.offload_policy and not ref)),
            optimizer_offload=bool(fsdp_config.optimizer_offload and not ref),
        )


def mesh_fsdp_size(fsdp_config: Any) -> int:
    """The FSDP group size of a role's mesh: ``fsdp_size`` (-1: all ranks); the reference always shards over all."""
    return -1 if isinstance(fsdp_config, RefFSDPConfig) else int(fsdp_config.fsdp_size)


def mesh_ep_size(fsdp_config: Any) -> int:
    """The expert-parallel size of a role's mesh: ``expert_parallel_size``; the reference keeps every expert
    FSDP-sharded (1): it runs forward only, and has no key of its own."""
    return 1 if isinstance(fsdp_config, RefFSDPConfig) else int(fsdp_config.expert_parallel_size)


def decoder_layers(model: nn.Module, layer_classes: list[str] | None = None) -> list[nn.Module]:
    """The modules sharded one group each: instances of ``layer_classes`` (default: ``model._no_split_modules``)."""
    names = set(layer_classes or getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"{type(model).__name__}: no decoder layers found to shard (looked for {sorted(names) or 'nothing'}; "
            "HF models list them in _no_split_modules); pass layer_classes=['MyDecoderLayer']"
        )
    return layers


def apply_fsdp2(model: nn.Module, mesh: ParallelMesh | DeviceMesh, settings: FSDPSettings | None = None, *,
                layer_classes: list[str] | None = None) -> nn.Module:
    """Shard ``model`` in place (per decoder layer, then the root) and return it. Collective."""
    settings = settings or FSDPSettings()
    fsdp_mesh = mesh.fsdp_mesh if isinstance(mesh, ParallelMesh) else mesh
    master_dtype = next(model.parameters()).dtype
    param_dtype = settings.param_dtype if settings.param_dtype != master_dtype else None
    kwargs = dict(
        mesh=fsdp_mesh,
        reshard_after_forward=settings.reshard_after_forward,
        mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=settings.reduce_dtype),
        offload_policy=CPUOffloadPolicy(pin_memory=get_backend().is_accelerator) if settings.param_offload
        else OffloadPolicy(),
    )
    layers = decoder_layers(model, layer_classes)
    experts = []
    if isinstance(mesh, ParallelMesh) and mesh.ep_mesh is not None:
        experts = apply_expert_parallel(model, mesh.ep_mesh)
        for module in experts:
            fully_shard(module, **{**kwargs, "mesh": mesh.efsdp_mesh}, shard_placement_fn=lambda _: Shard(1))
            module.set_gradient_divide_factor(float(mesh.dp_size))
            # gloo and HCCL have no PreMulSum: sum, then divide. Not on a 1-rank efsdp mesh (ep = world): there
            # torch 2.13's foreach_reduce divides by the factor in its copy *and* again after it (forced sum).
            module.set_force_sum_reduction_for_comms(mesh.efsdp_mesh.size() > 1)
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    if settings.forward_prefetch:
        for layer, next_layer in zip(layers, layers[1:]):
            layer.set_modules_to_forward_prefetch([next_layer])
    if isinstance(mesh, ParallelMesh) and mesh.sp_size > 1:
        for module in fsdp_modules(model):
            if not any(module is m for m in experts):  # set above
                module.set_gradient_divide_factor(float(mesh.dp_size))
                module.set_force_sum_reduction_for_comms(True)
    return model


def apply_fsdp2_from_config(model: nn.Module, fsdp_config: Any, *, sp_size: int = 1,
                            mesh: ParallelMesh | None = None, layer_classes: list[str] | None = None) -> nn.Module:
    """:func:`apply_fsdp2` with the settings of an ``fsdp_config`` node and (unless ``mesh`` is given) a mesh
    built from its ``fsdp_size`` and ``sp_size`` (the role's ``ulysses_sequence_parallel_size``). Collective."""
    mesh = mesh or build_mesh(sp_size=sp_size, fsdp_size=mesh_fsdp_size(fsdp_config),
                              ep_size=mesh_ep_size(fsdp_config))
    return apply_fsdp2(model, mesh, FSDPSettings.from_config(fsdp_config), layer_classes=layer_classes)


def fsdp_modules(model: nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip the (sharded) gradients to ``max_norm`` by their global norm; return that norm as a plain tensor
    (no ``.item()``: the caller decides when to sync). A non-finite norm is returned as is, gradients untouched
    beyond what ``clip_grad_norm_`` does (the trainer skips the step)."""
    params = [p for p in model.parameters() if p.grad is not None]
    groups: dict[Any, list[torch.Tensor]] = {}
    for param in params:  # expert parallelism: the experts' gradients live on another mesh (efsdp x ep)
        groups.setdefault(param.grad.device_mesh if isinstance(param.grad, DTensor) else None, []).append(param)
    if len(groups) < 2:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm
    # DTensor norms of different meshes cannot be stacked: one 2-norm per mesh, reduced there, then combined
    # (as torchtitan's clip with EP)
    norms = []
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group])
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = torch.stack(norms).square().sum().sqrt()
    for group in groups.values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total


# ---------------------------------------------------------------------------------------------- optimizer offload
def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> Iterator[tuple[dict, str, torch.Tensor]]:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":  # Adam's step counter stays where it is
                yield state, key, value


def offload_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Move the optimizer states to host memory."""
    for state, key, value in _optimizer_tensors(optimizer):
        state[key] = value.to("cpu", non_blocking=True)
    get_backend().synchronize()


def load_optimizer(optimizer: torch.optim.Optimizer, device: torch.device | None = None) -> None:
    """Move the optimizer states back to ``device`` (default: the current device)."""
    device = device or get_backend().device()
    for state, key, value in _optimizer_tensors(optimizer):
        state[key] = value.to(device, non_blocking=True)


@contextmanager
def optimizer_on_device(optimizer: torch.optim.Optimizer, settings: FSDPSettings):
    """States on the device inside the block, back on the host after it, when ``optimizer_offload`` is on and
    the parameters themselves are on the device (not ``param_offload``). Wrap ``optimizer.step()`` (and a
    checkpoint load/save if you like) with it."""
    active = settings.optimizer_offload and not settings.param_offload
    if active:
        load_optimizer(optimizer)
    try:
        yield
    finally:
        if active:
            offload_optimizer(optimizer)


def optimizer_step(optimizer: torch.optim.Optimizer, settings: FSDPSettings) -> None:
    """``optimizer.step()`` honouring ``optimizer_offload``: the one call the trainer needs."""
    with optimizer_on_device(optimizer, settings):
        optimizer.step()
