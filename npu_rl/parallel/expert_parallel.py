"""Expert parallelism (EP) for transformers' own MoE layers: each rank of an ``ep`` group holds ``E / ep`` experts of
every MoE layer, and the tokens travel to their experts and back by all-to-all.

The model code is transformers' (``Qwen3MoeSparseMoeBlock``, ``DeepseekV3MoE``, ...): its experts modules are
``@use_experts_implementation`` classes holding 3-D tensors (``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``),
and their ``forward`` dispatches on ``config._experts_implementation`` through transformers' ``ExpertsInterface``.
We register one more implementation there, ``npu_rl_ep`` (:func:`expert_parallel_forward`), and point each
expert-parallel experts module at it; the router, shared experts and everything else run unchanged.

Layout, as torchtitan does it: the expert tensors become DTensors ``Shard(0)`` on the ``ep`` mesh (rank ``r`` of
the group holds experts ``[r * E/ep, (r+1) * E/ep)``, a contiguous block), then FSDP2 shards them again over the
``efsdp`` mesh (the ranks holding the same experts; :func:`npu_rl.parallel.fsdp.apply_fsdp2`), on dim 1 so every
rank's slice is a contiguous block of the global tensor. Their global shape stays ``[E, ...]``, so checkpoints
(DCP), the sharded loader and ``npu-rl merge`` see the Hugging Face layout.

One MoE layer's forward on one rank, ``T`` tokens, top-``k`` routing, ``S = T * k`` (token, expert) pairs::

    sort the S pairs by expert id                       -> pairs grouped by destination rank, then expert
    all_to_all(counts per expert)                       -> how many rows arrive from each rank, for each local expert
    all_to_all(hidden rows)            [S, H] -> [R, H]  (dispatch; R rows for this rank's experts)
    local experts (the inner implementation: grouped_mm, batched_mm or eager, on the local [E/ep, ...] tensors)
    all_to_all(expert outputs)         [R, H] -> [S, H]  (combine; the reverse exchange)
    unsort, weight by the router's top-k weights, sum over k  -> [T, H]

The routing weights are applied on the token's own rank, after the combine, so the router's gradient never
travels; the all-to-alls are autograd functions whose backward is the reverse exchange. The split sizes need one
host sync per layer (``tolist``), as in torchtitan; under gradient checkpointing the recomputed forward exchanges
again (every rank recomputes the same layers in the same order).

Gradients: an expert's gradient on its rank sums the contributions of every rank's tokens (they came through the
all-to-all), so FSDP2 divides it by the data-parallel size, like every other gradient (``apply_fsdp2`` sets it).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface

IMPLEMENTATION = "npu_rl_ep"
KEY = "fsdp_config.expert_parallel_size"
EXPERT_TENSORS = ("gate_up_proj", "down_proj", "up_proj", "gate_up_proj_bias", "down_proj_bias", "up_proj_bias")


def num_experts_of(config: Any) -> int | None:
    """The number of routed experts of a model config (None: not a mixture-of-experts model)."""
    config = getattr(config, "get_text_config", lambda: config)()
    for name in ("num_experts", "n_routed_experts", "num_local_experts"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_expert_parallel(config: Any, ep_size: int, key: str = KEY) -> None:
    """Refuse an EP size the model cannot take: not a divisor of its experts, or EP on a dense model."""
    if ep_size == 1:
        return
    num_experts = num_experts_of(config)
    if num_experts is None:
        raise ValueError(f"{key}={ep_size}: the model ({type(config).__name__}) has no routed experts; "
                         "expert parallelism needs a mixture-of-experts model (set it to 1)")
    if ep_size < 1 or num_experts % ep_size:
        raise ValueError(f"{key}={ep_size} must divide the model's {num_experts} experts (each rank of an EP group "
                         "holds the same number of them)")


def is_experts_module(module: nn.Module) -> bool:
    """An experts module of transformers' experts interface (3-D expert tensors, dispatching forward): the
    ``@use_experts_implementation`` decorator sets ``is_concatenated`` on every release that has it (5.17 has no
    ``_is_expert_parallel``, which 5.19 added)."""
    return hasattr(module, "is_concatenated") and hasattr(module, "num_experts") and any(
        isinstance(getattr(module, name, None), nn.Parameter) for name in EXPERT_TENSORS)


def experts_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if is_experts_module(m)]


def apply_expert_parallel(model: nn.Module, ep_mesh: DeviceMesh) -> list[nn.Module]:
    """Shard every experts module of ``model`` over ``ep_mesh`` (in place, before FSDP2) and switch it to the
    all-to-all implementation; returns those modules. Works on a real model (each rank keeps its block of experts;
    every rank must hold the same values, as a seeded build or a load gives) and on a meta one (nothing is read).
    Not collective."""
    ep_size = ep_mesh.size()
    modules = experts_modules(model)
    if not modules:
        raise ValueError(f"{KEY}={ep_size}: {type(model).__name__} has no experts module of transformers' experts "
                         "interface (@use_experts_implementation) to split")
    for module in modules:
        if getattr(module, "_npu_rl_ep", None) is not None:
            raise ValueError(f"{type(module).__name__} is split over an ep mesh already")
        check_expert_parallel(module.config, ep_size)
        if module.num_experts % ep_size:
            raise ValueError(f"{KEY}={ep_size} must divide the {module.num_experts} experts of {type(module).__name__}")
        inner = module.config._experts_implementation or "eager"
        for name in EXPERT_TENSORS:
            param = getattr(module, name, None)
            if isinstance(param, nn.Parameter) and not isinstance(param, DTensor):
                # src_data_rank=None: each rank cuts its block from its own copy, no broadcast (a meta tensor
                # stays meta)
                sharded = distribute_tensor(param.data, ep_mesh, [Shard(0)], src_data_rank=None)
                setattr(module, name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        # The module's own config copy: model.config (saved with checkpoints, copied by rollouts) keeps its choice.
        module.config = copy.copy(module.config)
        module.config._experts_implementation_internal = IMPLEMENTATION
        module._npu_rl_ep = _EPState(ep_mesh.get_group(), ep_size, ep_mesh.get_local_rank(), inner)
    return modules


@dataclass(frozen=True)
class _EPState:
    """What the forward needs: the group, its size, this rank's place in it, the implementation of the local
    experts' math (the model's own choice: grouped_mm, batched_mm or eager)."""

    group: dist.ProcessGroup
    size: int
    rank: int
    inner: str


class _LocalExperts:
    """The experts module seen with its local tensors ``[E/ep, ...]`` and ``num_experts = E/ep``, so transformers'
    own implementations (eager, batched_mm, grouped_mm) compute the local experts unchanged. Methods of the
    module's class are bound to this view; every other attribute (``act_fn``, ``has_gate``, ...) is the module's."""

    def __init__(self, module: nn.Module, tensors: dict[str, torch.Tensor], num_experts: int):
        self._module = module
        self.__dict__.update(tensors)
        self.num_experts = num_experts
        self._is_expert_parallel = False  # transformers' own EP flag (replicated tokens + sentinels): not ours

    def __getattr__(self, name: str):
        attr = getattr(type(self._module), name, None)
        if callable(attr) and not isinstance(attr, type) and hasattr(attr, "__get__"):
            return attr.__get__(self)
        return getattr(self._module, name)


def _inner_forward(module: nn.Module, inner: str):
    original = type(module).forward
    eager = getattr(original, "__wrapped__", original)  # use_experts_implementation wraps the eager forward
    return ALL_EXPERTS_FUNCTIONS.get_interface(inner, eager) if inner != "eager" else eager


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits; the backward sends the gradients back the way the rows came."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, output_splits: list[int], input_splits: list[int], group):
        ctx.splits, ctx.group = (output_splits, input_splits), group
        out = x.new_empty((sum(output_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        output_splits, input_splits = ctx.splits
        return _AllToAll.apply(grad.contiguous(), input_splits, output_splits, ctx.group), None, None, None


def _exchange_counts(counts: torch.Tensor, state: _EPState) -> torch.Tensor:
    """``counts [E]`` rows this rank sends to each expert -> ``[ep, E/ep]`` rows each rank sends to this rank's
    experts."""
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=state.group)
    return received.view(state.size, -1)


def expert_parallel_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                            top_k_weights: torch.Tensor) -> torch.Tensor:
    """The ``npu_rl_ep`` experts implementation (see the module docstring). ``hidden_states [T, H]``,
    ``top_k_index [T, k]`` global expert ids, ``top_k_weights [T, k]``; returns ``[T, H]``."""
    state: _EPState | None = getattr(self, "_npu_rl_ep", None)
    if state is None:
        raise RuntimeError(f"{type(self).__name__} is set to the {IMPLEMENTATION!r} experts implementation but was "
                           "not split by npu_rl.parallel.expert_parallel.apply_expert_parallel")
    num_tokens, num_top_k = top_k_index.shape
    num_local = self.num_experts // state.size
    expert_ids = top_k_index.reshape(-1)  # [S]
    order = torch.argsort(expert_ids, stable=True)  # pairs grouped by expert, so by destination rank
    rows = hidden_states[order // num_top_k]  # [S, H]
    counts = torch.bincount(expert_ids, minlength=self.num_experts)  # [E]
    received = _exchange_counts(counts, state)  # [ep, E/ep]
    # rows to send to / receive from each rank: one host sync for both
    input_splits, output_splits = torch.stack([counts.view(state.size, num_local).sum(1), received.sum(1)]).tolist()
    arrived = _AllToAll.apply(rows, output_splits, input_splits, state.group)  # [R, H]
    # The arrived rows are grouped by source rank, then local expert: the local expert id of each row.
    local_ids = torch.repeat_interleave(torch.arange(num_local, device=counts.device).repeat(state.size),
                                        received.reshape(-1))
    tensors = {name: getattr(self, name).to_local() for name in EXPERT_TENSORS
               if isinstance(getattr(self, name, None), DTensor)}
    local = _LocalExperts(self, tensors, num_local)
    if arrived.shape[0]:
        ones = torch.ones(arrived.shape[0], 1, dtype=top_k_weights.dtype, device=arrived.device)
        outputs = _inner_forward(self, state.inner)(local, arrived, local_ids[:, None], ones)  # [R, H]
    else:  # no token for these experts: keep them in the graph (zero gradient) so every rank's backward agrees
        outputs = arrived + sum(t.sum() for t in tensors.values()) * 0
    back = _AllToAll.apply(outputs, input_splits, output_splits, state.group)  # [S, H], sorted order
    pairs = torch.empty_like(back).index_copy(0, order, back)  # [S, H] in (token, k) order; autograd-aware
    weighted = pairs.view(num_tokens, num_top_k, -1) * top_k_weights.unsqueeze(-1)
    return weighted.sum(dim=1).to(hidden_states.dtype)


ExpertsInterface.register(IMPLEMENTATION, expert_parallel_forward)
