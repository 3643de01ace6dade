"""The routers of a transformers mixture-of-experts model: their load, their auxiliary loss, and router replay.

No second copy of the MoE layer: transformers' own router module (``Qwen3MoeTopKRouter``, ``DeepseekV3TopkRouter``,
``Qwen2MoeTopKRouter``, ``MixtralTopKRouter``; found through the model's ``_can_record_outputs["router_logits"]``)
returns ``(router_logits [N, E], topk_weights [N, K], topk_indices [N, K])`` for the N tokens it sees, and this module
only hooks it:

- **Capture**: a forward hook keeps each layer's logits and indices (the first call of each router per forward:
  gradient checkpointing's recompute runs the routers again during backward).
- **Replay** (verl's R2 / R3, slime's R3): the router runs its own arithmetic, but the one ``topk`` that selects the
  experts (input ``[N, E]``, ``k = top_k``) returns the recorded indices, with their values gathered from the
  current scores. So the weights are recomputed from the current logits (softmax or sigmoid, the normalisation,
  DeepSeek-V3's ``routed_scaling_factor``) and the gradient reaches the router through them, as R3 does. A token
  recorded as ``-1`` (not recorded: the last generated token) keeps the router's own choice.

Conventions: ``routed_experts`` is ``[B, T, L, K]`` (int, -1 where not recorded) over the ``L`` routers in module
order (dense layers, e.g. DeepSeek-V3's first ``first_k_dense_replace``, have none); the router's N rows are the
model's tokens flattened in the order it sees them (``[B*T]`` padded, or the packed ``[1, total]`` slice).
The state lives on the hooks, armed for one micro-batch until replaced or cleared, so gradient checkpointing's
recompute in backward replays the same experts.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a PEFT wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def router_class(model: torch.nn.Module) -> type | None:
    """The model's router module class, from transformers' output-recording table; None for a dense model."""
    recorder = (getattr(base_model(model), "_can_record_outputs", None) or {}).get("router_logits")
    target = getattr(recorder, "target_class", None)
    return target if isinstance(target, type) else None


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's router modules in layer order ([] for a dense model)."""
    cls = router_class(model)
    return [m for m in model.modules() if isinstance(m, cls)] if cls is not None else []


def is_moe(model: torch.nn.Module) -> bool:
    return bool(routers(model))


def aux_loss_settings(model: torch.nn.Module) -> tuple[bool, float]:
    """(whether the model adds its load-balancing loss, its coefficient): transformers' own switch
    ``config.output_router_logits`` and ``config.router_aux_loss_coef`` (set them with
    ``actor_rollout_ref.model.override_config``). DeepSeek-V3 has no auxiliary loss (bias-balanced routing)."""
    config = base_model(model).config
    has_fn = _load_balancing_loss_fn(model) is not None
    return bool(has_fn and getattr(config, "output_router_logits", False)), float(
        getattr(config, "router_aux_loss_coef", 0.0) or 0.0)


def _load_balancing_loss_fn(model: torch.nn.Module):
    return getattr(sys.modules.get(type(base_model(model)).__module__), "load_balancing_loss_func", None)


# ------------------------------------------------------------------------------------------------- replay's topk
class _ReplayTopk(TorchFunctionMode):
    """Inside one router's forward: the ``topk`` over ``[N, E]`` with ``k = top_k`` returns ``recorded`` [N, K]
    (where >= 0) and the scores gathered there; ``natural`` keeps what the router would have chosen."""

    def __init__(self, recorded: torch.Tensor | None, num_experts: int, top_k: int):
        super().__init__()
        self.recorded, self.num_experts, self.top_k = recorded, num_experts, top_k
        self.natural: torch.Tensor | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.topk, torch.Tensor.topk):
            scores = args[0]
            k = args[1] if len(args) > 1 else kwargs.get("k")
            if scores.dim() == 2 and scores.shape[-1] == self.num_experts and k == self.top_k:
                values, indices = func(*args, **kwargs)
                self.natural = indices
                if self.recorded is None:
                    return values, indices
                recorded = self.recorded.to(indices.device, torch.long)
                chosen = torch.where(recorded >= 0, recorded, indices)
                return torch.return_types.topk((scores.gather(-1, chosen), chosen))
        return func(*args, **kwargs)


@dataclass
class _LayerRecord:
    logits: torch.Tensor  # [N, E]
    indices: torch.Tensor  # [N, K] used by the layer
    natural: torch.Tensor  # [N, K] the router's own choice


@dataclass
class RouterHooks:
    """Hooks on every router of a model. ``arm`` a micro-batch's capture and replay; ``records`` after its forward."""

    model: torch.nn.Module
    modules: list[torch.nn.Module] = field(default_factory=list)
    handles: list = field(default_factory=list)
    capturing: bool = False
    replay: torch.Tensor | None = None  # [N, L, K]
    records: dict[int, _LayerRecord] = field(default_factory=dict)
    _modes: dict[int, _ReplayTopk] = field(default_factory=dict)

    def __post_init__(self):
        self.modules = routers(self.model)
        for layer, module in enumerate(self.modules):
            self.handles.append(module.register_forward_pre_hook(self._pre(layer)))
            self.handles.append(module.register_forward_hook(self._post(layer)))

    @property
    def num_layers(self) -> int:
        return len(self.modules)

    @property
    def top_k(self) -> int:
        return int(self.modules[0].top_k)

    @property
    def num_experts(self) -> int:
        return int(self.modules[0].num_experts)

    def arm(self, *, capture: bool, replay: torch.Tensor | None = None) -> None:
        """Start a micro-batch: forget the last records; ``replay`` [N, L, K] (None: the routers choose)."""
        if replay is not None and (replay.dim() != 3 or replay.shape[1:] != (self.num_layers, self.top_k)):
            raise ValueError(f"router replay: recorded experts of shape {tuple(replay.shape)} do not fit this model's "
                             f"{self.num_layers} routers with top_k={self.top_k} ([tokens, layers, top_k])")
        self.capturing, self.replay, self.records = capture, replay, {}

    def clear(self) -> None:
        self.capturing, self.replay, self.records = False, None, {}

    def remove(self) -> None:
        self.clear()
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _pre(self, layer: int):
        def hook(module, args):
            if not self.capturing and self.replay is None:
                return None
            recorded = None
            if self.replay is not None:
                recorded = self.replay[:, layer]
                rows = args[0].reshape(-1, args[0].shape[-1]).shape[0]
                if recorded.shape[0] != rows:
                    raise ValueError(f"router replay: layer {layer} routes {rows} tokens, {recorded.shape[0]} were "
                                     f"recorded")
            mode = _ReplayTopk(recorded, int(module.num_experts), int(module.top_k))
            mode.__enter__()
            self._modes[layer] = mode
            return None

        return hook

    def _post(self, layer: int):
        def hook(module, args, output):
            mode = self._modes.pop(layer, None)
            if mode is None:
                return None
            mode.__exit__(None, None, None)
            if self.capturing and layer not in self.records:  # the first call; a recompute in backward is not new
                logits, _, indices = output
                natural = mode.natural if mode.natural is not None else indices
                self.records[layer] = _LayerRecord(logits, indices.detach(), natural.detach())
            return None

        return hook

    # ---------------------------------------------------------------------------------------- what was captured
    def stacked_indices(self, natural: bool = False) -> torch.Tensor:
        """[N, L, K] experts the layers used (``natural``: the routers' own choice)."""
        self._check_complete()
        return torch.stack([(r.natural if natural else r.indices) for _, r in sorted(self.records.items())], dim=1)

    def logits(self) -> tuple[torch.Tensor, ...]:
        self._check_complete()
        return tuple(r.logits for _, r in sorted(self.records.items()))

    def _check_complete(self):
        if len(self.records) != self.num_layers:
            raise RuntimeError(f"router capture: {len(self.records)} of {self.num_layers} routers ran (was the hook "
                               f"armed with capture=True before the forward?)")


def install_router_hooks(model: torch.nn.Module) -> RouterHooks | None:
    """Hooks on ``model``'s routers; None for a dense model."""
    return RouterHooks(model) if is_moe(model) else None


# ------------------------------------------------------------------------------------------------- load and loss
def expert_load(indices: torch.Tensor, token_mask: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Tokens routed to each expert of each layer: ``indices`` [N, L, K], ``token_mask`` [N] -> [L, E] float
    (a token counts once per expert it is routed to)."""
    num_layers = indices.shape[1]
    weights = token_mask.float().reshape(-1, 1, 1).expand_as(indices)
    flat = (indices.long() + torch.arange(num_layers, device=indices.device).view(1, -1, 1) * num_experts)
    counts = torch.zeros(num_layers * num_experts, device=indices.device)
    counts.scatter_add_(0, flat.reshape(-1), weights.reshape(-1).to(counts.device))
    return counts.view(num_layers, num_experts)


def load_metrics(counts: torch.Tensor, prefix: str = "actor/moe") -> dict[str, torch.Tensor]:
    """From [L, E] token counts: ``tokens_per_expert_max`` / ``_mean`` (max and mean over experts, then averaged over
    layers), ``max_over_mean`` (mean over layers of max/mean; 1 = perfectly even), ``max_over_mean_worst`` (its worst
    layer) and ``dead_expert_share`` (share of (layer, expert) pairs that received no token)."""
    per_layer_max, per_layer_mean = counts.max(dim=-1).values, counts.mean(dim=-1)
    imbalance = per_layer_max / per_layer_mean.clamp(min=1e-9)
    return {f"{prefix}/tokens_per_expert_max": per_layer_max.mean(),
            f"{prefix}/tokens_per_expert_mean": per_layer_mean.mean(),
            f"{prefix}/max_over_mean": imbalance.mean(),
            f"{prefix}/max_over_mean_worst": imbalance.max(),
            f"{prefix}/dead_expert_share": (counts == 0).float().mean()}


def has_correction_bias(model: torch.nn.Module) -> bool:
    """Whether the routers choose with a load-balancing bias (DeepSeek-V3's ``e_score_correction_bias``)."""
    modules = routers(model)
    return bool(modules) and all(hasattr(m, "e_score_correction_bias") for m in modules)


@torch.no_grad()
def update_correction_bias(models: list[torch.nn.Module], counts: torch.Tensor, rate: float) -> torch.Tensor:
    """DeepSeek-V3's auxiliary-loss-free balancing (arXiv:2412.19437, section 2.1.2): after an optimizer step each
    layer's bias moves by ``rate`` towards balance, ``b_e += rate * sign(mean_e' load - load_e)`` (an overloaded
    expert is chosen less, an underloaded one more; an expert at the mean keeps its bias). ``counts`` [L, E]: the
    step's tokens per expert (all ranks). Applied to every copy in ``models`` (a master and its compute copy);
    returns the mean absolute bias after the update."""
    step = rate * torch.sign(counts.mean(dim=-1, keepdim=True) - counts)  # [L, E]
    biases = []
    for model in models:
        for layer, router in enumerate(routers(model)):
            bias = router.e_score_correction_bias
            bias.add_(step[layer].to(bias.device, bias.dtype))
            biases.append(bias)
    return torch.stack([b.float().abs().mean().cpu() for b in biases]).mean()


def topk_mismatch(recorded: torch.Tensor, computed: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """Share of (token, layer) pairs whose set of top-k experts differs: ``recorded`` / ``computed`` [N, L, K],
    ``token_mask`` [N] (tokens with an unrecorded ``-1`` are left out)."""
    same = (recorded.long().sort(dim=-1).values == computed.long().sort(dim=-1).values).all(dim=-1)  # [N, L]
    valid = token_mask.bool().unsqueeze(-1) & (recorded >= 0).all(dim=-1)
    return ((~same) & valid).float().sum() / valid.float().sum().clamp(min=1.0)


def aux_loss(model: torch.nn.Module, hooks: RouterHooks, token_mask: torch.Tensor) -> torch.Tensor | None:
    """The model's own load-balancing loss (transformers' ``load_balancing_loss_func`` of its modeling module) on
    the captured router logits, padding left out by ``token_mask`` [N]; None when the model has none."""
    fn = _load_balancing_loss_fn(model)
    if fn is None:
        return None
    return fn(hooks.logits(), hooks.num_experts, hooks.top_k, token_mask.reshape(-1))


# ------------------------------------------------------------------------------------------------- rollout capture
class GenerationRouting:
    """Records the experts of every router call during ``generate`` (the hf engine's capture for router replay).

    ``generate`` calls each router once for the prompt (``[rows * P, K]``, the prefill) and once per decode step
    (``[rows, K]``, the token drawn at the previous step), so the calls concatenate to positions ``0 .. P + G - 2``
    of the ``G`` generated tokens; the last generated token is never fed back and stays ``-1``."""

    def __init__(self, model: torch.nn.Module):
        self.modules = routers(model)
        if not self.modules:
            raise ValueError(f"{type(base_model(model)).__name__} has no mixture-of-experts router to record")
        self.calls: list[list[torch.Tensor]] = [[] for _ in self.modules]
        self.handles = [module.register_forward_hook(self._hook(layer)) for layer, module in enumerate(self.modules)]

    def _hook(self, layer: int):
        def hook(module, args, output):
            self.calls[layer].append(output[2].detach().to(torch.int16))

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def routed_experts(self, num_rows: int, prompt_width: int, width: int) -> torch.Tensor:
        """``[rows, width, L, K]`` int16, -1 where nothing was routed (positions past the last fed token)."""
        per_layer = []
        for layer, calls in enumerate(self.calls):
            if not calls:
                raise RuntimeError(f"router {layer} never ran during generate")
            first, rest = calls[0], calls[1:]
            if first.shape[0] != num_rows * prompt_width or any(c.shape[0] != num_rows for c in rest):
                raise RuntimeError(f"router {layer}: calls of {[c.shape[0] for c in calls][:4]}... rows do not match "
                                   f"a prefill of {num_rows} x {prompt_width} tokens then one token per row")
            positions = [first.view(num_rows, prompt_width, -1)] + [c.view(num_rows, 1, -1) for c in rest]
            per_layer.append(torch.cat(positions, dim=1))
        recorded = torch.stack(per_layer, dim=2)  # [rows, P + calls - 1, L, K]
        if recorded.shape[1] > width:
            raise RuntimeError(f"recorded {recorded.shape[1]} positions for a sequence of {width}")
        out = recorded.new_full((num_rows, width, *recorded.shape[2:]), -1)
        out[:, : recorded.shape[1]] = recorded
        return out
