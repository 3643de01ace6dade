"""LoRA adapters (PEFT) on a Hugging Face causal LM, with verl's keys.

Keys (``actor_rollout_ref.model.*``, and ``critic.model.*`` for the critic): ``lora_rank`` (0: off), ``lora_alpha``,
``target_modules`` (``"all-linear"``, a list of module-name suffixes, or one regular expression matched against the
full module name: PEFT's rules), ``exclude_modules`` (same rules), ``lora_adapter_path`` (a PEFT adapter folder to
continue training from).

Precision: the base model is loaded in the compute dtype (``mixed_precision.param_dtype``, bf16 by default) and
frozen; the adapter parameters (``lora_A`` / ``lora_B``) are fp32, and so are their gradients and AdamW states.
On one device no fp32 master copy of the base is kept (it is never updated): the compute module shares the base
with the master module and holds bf16 copies of the adapters only (``workers.model_runner.shared_compute_copy``),
so the adapter branch runs in bf16 too. Under FSDP2 the base shards are bf16 and the adapters fp32 in the same
groups (FSDP2 casts the adapters to the compute dtype on all-gather).

What else works through this module:

- the reference policy is the same model under :func:`adapter_disabled` (no second copy of the weights);
- :func:`merged_named_weights`: ``(HF name, W + scale * B @ A)`` one tensor at a time, for a rollout engine that
  takes plain weights; :func:`adapter_tensors`: the adapter alone, in PEFT's state-dict names;
- :func:`addmm_lora_forward`: the adapted linears' forward, PEFT's arithmetic in one in-place ``addmm_``;
- :func:`output_weight`: the effective weight of the output layer, so the swapped lm_head of
  :mod:`npu_rl.models.forward` (plain and fused log-prob kernels) stays right with a LoRA on ``lm_head``;
- :func:`save_adapter` (a PEFT folder), :func:`load_adapter_model` and :func:`merge_adapter` (``npu-rl merge`` /
  ``npu-rl eval``).

Adapter files are read from ``adapter_model.safetensors`` only: a pickled ``adapter_model.bin`` is refused.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from npu_rl.config.errors import ConfigError
from npu_rl.models.loader import cache_dir, check_model_path, is_builtin, load_causal_lm
from npu_rl.parallel.weights import full_tensor, hf_model_class, save_hf_state_dict

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # PeftModel -> LoraModel -> the HF model
ADAPTER_NAME = "default"


class LoraConfigError(ValueError):
    """A LoRA setting that cannot work with this model or adapter (raised at start-up)."""


@dataclass(frozen=True)
class LoraSpec:
    rank: int = 0
    alpha: float = 16
    target_modules: Any = "all-linear"
    exclude_modules: Any = None
    adapter_path: str | None = None
    key: str = "actor_rollout_ref.model"  # where the keys live, for messages

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @classmethod
    def from_config(cls, model_cfg: Any, key: str = "actor_rollout_ref.model") -> LoraSpec:
        def listify(value):
            if value is None or isinstance(value, str):
                return value
            return [str(v) for v in value]

        return cls(rank=int(getattr(model_cfg, "lora_rank", 0) or 0), alpha=float(getattr(model_cfg, "lora_alpha", 16)),
                   target_modules=listify(getattr(model_cfg, "target_modules", "all-linear")),
                   exclude_modules=listify(getattr(model_cfg, "exclude_modules", None)) or None,
                   adapter_path=getattr(model_cfg, "lora_adapter_path", None), key=key)


def check_spec(spec: LoraSpec) -> list[str]:
    """Problems visible from the keys alone (no model needed): for config validation."""
    k, problems = spec.key, []
    if spec.rank < 0:
        problems.append(f"{k}.lora_rank={spec.rank} must be >= 0 (0: LoRA off)")
    if spec.rank == 0 and spec.adapter_path:
        problems.append(f"{k}.lora_adapter_path={spec.adapter_path!r} is set but {k}.lora_rank=0 (LoRA off): set "
                        "lora_rank to the adapter's rank (its adapter_config.json 'r'), or drop the path")
    if spec.enabled:
        if not (math.isfinite(spec.alpha) and spec.alpha > 0):
            problems.append(f"{k}.lora_alpha={spec.alpha:g} must be a finite number > 0")
        target = spec.target_modules
        if not (isinstance(target, str) and target) and not (isinstance(target, list) and target):
            problems.append(f"{k}.target_modules={target!r}: expected 'all-linear', a regex, or a non-empty list "
                            "of module names")
        if spec.adapter_path and not os.path.isdir(os.path.expanduser(spec.adapter_path)):
            problems.append(f"{k}.lora_adapter_path={spec.adapter_path!r} is not a folder (expected a PEFT adapter "
                            f"folder with {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    return problems


# ---------------------------------------------------------------------------------------------- targets
def output_layer_name(model: nn.Module) -> str | None:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        return None
    return next((name for name, module in model.named_modules() if module is head), None)


def _match(name: str, pattern: Any) -> bool:
    """PEFT's rule: a string is a regex on the full name; a list entry matches the name or a dotted suffix of it."""
    if isinstance(pattern, str):
        return re.fullmatch(pattern, name) is not None
    return any(name == p or name.endswith("." + p) for p in pattern)


def vision_tower_name(model: nn.Module) -> str | None:
    """The module name of a Qwen-VL model's vision tower (``model.visual``), None for a text model."""
    inner = getattr(model, "model", None)
    tower = getattr(inner, "visual", None)
    if tower is None:
        return None
    return next((name for name, module in model.named_modules() if module is tower), None)


def resolve_target_modules(model: nn.Module, target_modules: Any, exclude_modules: Any = None,
                           key: str = "actor_rollout_ref.model") -> list[str]:
    """Full names of the ``nn.Linear`` layers that get an adapter; a clear error when that is none.

    ``all-linear`` is PEFT's meaning (every linear layer but the output layer) except on a vision-language model,
    where it means the language model's linear layers only: the vision tower (and its merger) stays frozen without
    an adapter, as verl's Megatron LoRA defaults to (``lora.freeze_vision_model``); PEFT's own ``all-linear``, which
    verl's FSDP workers pass, would put adapters on the vision tower too. A list or a regex naming vision modules
    (``qkv``, ``.*visual.*``) adapts them as asked."""
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if target_modules == "all-linear":  # PEFT's meaning: every linear layer but the output layer
        head = output_layer_name(model)
        tower = vision_tower_name(model)
        chosen = [n for n in linears if n != head and not (tower and n.startswith(tower + "."))]
    else:
        chosen = [n for n in linears if _match(n, target_modules)]
    if exclude_modules:
        chosen = [n for n in chosen if not _match(n, exclude_modules)]
    if not chosen:
        suffixes = sorted({n.rsplit(".", 1)[-1] for n in linears})
        raise LoraConfigError(
            f"{key}.target_modules={target_modules!r} (exclude_modules={exclude_modules!r}) matches no linear layer "
            f"of {type(model).__name__}; its linear layers are named ...{', ...'.join(suffixes)} "
            "(give 'all-linear', a list of those names, or a regex on the full name)")
    return chosen


# ---------------------------------------------------------------------------------------------- adapter files
MAX_LORA_SCALE = 1024.0  # lora_alpha / r (rsLoRA: / sqrt(r)); published adapters use 0.5-16


def read_adapter_config(path: str) -> dict:
    folder = os.path.expanduser(path)
    config_file = os.path.join(folder, ADAPTER_CONFIG)
    if not os.path.isfile(config_file):
        raise LoraConfigError(f"lora_adapter_path={path!r}: no {ADAPTER_CONFIG} there (not a PEFT adapter folder)")
    if not os.path.isfile(os.path.join(folder, ADAPTER_WEIGHTS)):
        raise LoraConfigError(f"lora_adapter_path={path!r}: no {ADAPTER_WEIGHTS} there (a pickled adapter_model.bin "
                              "is not loaded: convert it to safetensors)")
    try:
        with open(config_file, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise LoraConfigError(f"{config_file} cannot be read as JSON: {type(exc).__name__}: {exc}") from None
    if not isinstance(config, dict):
        raise LoraConfigError(f"{config_file}: expected a JSON object, got {type(config).__name__}")
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise LoraConfigError(f"{config_file}: peft_type={config.get('peft_type')!r}, only LORA adapters are supported")
    rank, alpha = config.get("r"), config.get("lora_alpha", 8)
    if not (isinstance(rank, int) and not isinstance(rank, bool) and rank > 0):
        raise LoraConfigError(f"{config_file}: r={rank!r} must be a positive integer (the adapter's rank)")
    if not (isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and math.isfinite(alpha) and alpha > 0):
        raise LoraConfigError(f"{config_file}: lora_alpha={alpha!r} must be a finite number > 0")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    if scale > MAX_LORA_SCALE:  # B is zero at the start, so the weights alone do not show it: the first update would
        raise LoraConfigError(f"{config_file}: lora_alpha={alpha:g} with r={rank} scales the adapter's update by "
                              f"{scale:.3g}, past {MAX_LORA_SCALE:g} (adapters use 0.5-16): not a usable adapter; "
                              "fix lora_alpha")
    if config.get("modules_to_save"):
        raise LoraConfigError(f"{config_file}: modules_to_save={config['modules_to_save']!r} (whole layers trained "
                              "beside the adapter) is not supported: only the LoRA A/B matrices are loaded; merge "
                              "the adapter into its base with PEFT (merge_and_unload) and train that model instead")
    return config


def check_adapter_values(path: str, config: dict) -> None:
    """Every adapter weight is finite, and the update ``scale * B @ A`` cannot overflow float32 in any layer (a
    bound from the largest entries: ``scale * r * max|A| * max|B|``); otherwise the first bad tensor is named."""
    from safetensors import safe_open

    weights_file = os.path.join(os.path.expanduser(path), ADAPTER_WEIGHTS)
    rank = int(config["r"])
    alpha = float(config.get("lora_alpha", 8))
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    largest: dict[str, dict[str, float]] = {}
    with safe_open(weights_file, framework="pt") as f:
        for tensor_key in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
            tensor = f.get_tensor(tensor_key).float()
            if not bool(torch.isfinite(tensor).all()):
                raise LoraConfigError(f"{weights_file}: tensor {tensor_key!r} holds NaN or infinite values")
            match = re.fullmatch(r"(.+)\.(lora_A|lora_B)(?:\.\w+)?\.weight", tensor_key)
            if match is not None:
                largest.setdefault(match[1], {})[match[2]] = float(tensor.abs().max()) if tensor.numel() else 0.0
    limit = float(torch.finfo(torch.float32).max)
    for module, parts in largest.items():
        bound = scale * rank * parts.get("lora_A", 0.0) * parts.get("lora_B", 0.0)
        if not bound < limit:
            raise LoraConfigError(f"{weights_file}: the update of {module} (lora_alpha={alpha:g} / r={rank} times "
                                  f"B @ A) can reach {bound:.3g}, past float32's range: the adapter or its "
                                  f"lora_alpha in {ADAPTER_CONFIG} is not usable")


def check_adapter(path: str, model: nn.Module, spec: LoraSpec) -> dict:
    """The adapter at ``path`` fits ``model`` (the plain HF model): every tensor names an existing linear layer and
    has the shape that layer needs, its rank is ``spec.rank``, and its values are usable (``check_adapter_values``).
    Returns its adapter_config."""
    from safetensors import safe_open

    config = read_adapter_config(path)
    weights_file = os.path.join(os.path.expanduser(path), ADAPTER_WEIGHTS)
    recorded_base = config.get("base_model_name_or_path")
    where = f"{weights_file} (adapter trained on {recorded_base!r})"
    if int(config.get("r", spec.rank)) != spec.rank:
        raise LoraConfigError(f"{spec.key}.lora_rank={spec.rank} but the adapter at {path!r} has r={config.get('r')}: "
                              "set lora_rank to the adapter's rank")
    modules = dict(model.named_modules())
    with safe_open(weights_file, framework="pt") as f:
        for tensor_key in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
            match = re.fullmatch(r"(?:base_model\.model\.)?(.+)\.(lora_A|lora_B)(?:\.\w+)?\.weight", tensor_key)
            if match is None:
                raise LoraConfigError(f"{where}: tensor {tensor_key!r} is not a LoRA A/B weight")
            module_name, part = match.groups()
            layer = modules.get(module_name)
            if not isinstance(layer, nn.Linear):
                raise LoraConfigError(f"{where}: {tensor_key!r} adapts {module_name!r}, which is not a linear layer "
                                      f"of {type(model).__name__}: the adapter belongs to a different base model")
            shape = tuple(f.get_slice(tensor_key).get_shape())
            want = (spec.rank, layer.in_features) if part == "lora_A" else (layer.out_features, spec.rank)
            if shape != want:
                raise LoraConfigError(f"{where}: {tensor_key!r} has shape {list(shape)}, this model's "
                                      f"{module_name} needs {list(want)}: the adapter belongs to a different base model")
    check_adapter_values(path, config)
    return config


# ---------------------------------------------------------------------------------------------- the PEFT model
def apply_lora(model: nn.Module, spec: LoraSpec, base_path: str | None = None, seed: int = 0) -> nn.Module:
    """``model`` (already in the compute dtype) wrapped as a PEFT model: the base frozen, fp32 adapters (fresh, or
    loaded from ``spec.adapter_path``). Call before FSDP2 sharding and before moving to the device.

    Fresh ``lora_A`` matrices are random: they are drawn from ``seed`` alone (the global RNG is left as it was),
    so every rank builds the same adapter before FSDP2 keeps its shard of it, and a run does not depend on how
    many ranks it has. On a base built on the meta device (the sharded load) the adapters are drawn on the host,
    exactly as on one device (:func:`_draw_adapters_on_host`), and kept there for the load to slice."""
    if not spec.enabled:
        raise ValueError("apply_lora: lora_rank is 0")
    on_meta = any(p.device.type == "meta" for p in model.parameters())
    peft_model = _wrap(model, spec, base_path, seed)
    if on_meta:
        _draw_adapters_on_host(peft_model, spec, seed)
    for name, param in peft_model.named_parameters():
        if "lora_" in name:
            param.data = param.data.float()
            param.requires_grad_(True)
        else:
            param.requires_grad_(False)
    use_addmm_forward(peft_model)
    return peft_model


def _draw_adapters_on_host(peft_model: nn.Module, spec: LoraSpec, seed: int) -> None:
    """On a base built on the meta device PEFT leaves the new adapters on meta (no values). Make them real on the
    host and draw them as on one device: PEFT's ``update_layer`` runs, for each adapted layer in module order, the
    constructors of ``lora_A`` and ``lora_B`` (each an ``nn.Linear``: ``reset_parameters``) and then
    ``reset_lora_parameters`` (kaiming-uniform A, zero B), all from ``seed``; then the cast to the base dtype. A
    saved adapter is read again from its file. The sharded load then slices these full values (tests/parallel/
    test_sharded_load.py checks them bit for bit against the one-device path)."""
    layers = [layer for _, layer in lora_layers(peft_model)]
    if any(len(layer.lora_embedding_A) for layer in layers):
        raise LoraConfigError(f"{spec.key}: LoRA on embedding layers is not supported with the sharded load "
                              "(several ranks): leave embed_tokens out of target_modules")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for layer in layers:
            dtype = layer.get_base_layer().weight.dtype
            for adapter in list(layer.lora_A.keys()):
                pair = (layer.lora_A[adapter], layer.lora_B[adapter])
                for module in pair:
                    module.to_empty(device="cpu").float()  # drawn in fp32 as there (PEFT cast the meta ones)
                    module.reset_parameters()  # the draw of its constructor
                layer.reset_lora_parameters(adapter, True)
                for module in pair:
                    module.to(dtype)
    if spec.adapter_path:
        from peft.utils import set_peft_model_state_dict
        from safetensors.torch import load_file

        weights = load_file(os.path.join(os.path.expanduser(spec.adapter_path), ADAPTER_WEIGHTS))
        result = set_peft_model_state_dict(peft_model, weights, adapter_name=ADAPTER_NAME)
        if getattr(result, "unexpected_keys", None):
            raise LoraConfigError(f"{spec.adapter_path}: tensors the model has no place for: "
                                  f"{', '.join(result.unexpected_keys[:5])}")


def _wrap(model: nn.Module, spec: LoraSpec, base_path: str | None, seed: int) -> nn.Module:
    """The PEFT model: an adapter loaded from ``spec.adapter_path``, or a fresh one drawn from ``seed``."""
    from peft import LoraConfig, PeftModel, get_peft_model

    chosen = resolve_target_modules(model, spec.target_modules, spec.exclude_modules, spec.key)  # error when empty
    targets = spec.target_modules
    if targets == "all-linear" and vision_tower_name(model) is not None:
        targets = chosen  # the language model's linear layers, by full name (PEFT's all-linear takes the tower too)
    if spec.adapter_path:
        check_adapter(spec.adapter_path, model, spec)
        peft_model = PeftModel.from_pretrained(model, os.path.expanduser(spec.adapter_path), is_trainable=True,
                                               autocast_adapter_dtype=False)
        if base_path is not None:  # what a saved checkpoint's adapter records as its base
            peft_model.peft_config[ADAPTER_NAME].base_model_name_or_path = base_path
    else:
        config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=targets,
                            exclude_modules=spec.exclude_modules, lora_dropout=0.0, bias="none",
                            task_type="CAUSAL_LM", base_model_name_or_path=base_path)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            peft_model = get_peft_model(model, config, autocast_adapter_dtype=False)
    unwrap_expert_adapters(peft_model)
    if not spec.adapter_path:  # a loaded adapter brings its own targets (check_adapter)
        check_every_target_adapted(peft_model, chosen, spec.key)
    return peft_model


def check_every_target_adapted(peft_model: nn.Module, chosen: list[str], key: str) -> None:
    """Every linear layer ``target_modules`` names got an adapter, or a clear error: PEFT may drop targets on its
    own (0.21 and older, under transformers 5, took a DeepSeek-V3 shared expert's and dense layers' ``gate_proj`` /
    ``up_proj`` / ``down_proj`` off with the routed experts'), and a run would train fewer layers than asked."""
    adapted = {name.removeprefix("base_model.model.") for name, _ in lora_layers(peft_model)}
    missing = [name for name in chosen if name not in adapted]
    if missing:
        import peft

        raise LoraConfigError(
            f"{key}.target_modules: PEFT {peft.__version__} put no adapter on {len(missing)} of the {len(chosen)} "
            f"linear layers it names ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); PEFT 0.21 and "
            "older drop a mixture-of-experts model's shared-expert and dense-layer projections: pip install "
            "'peft>=0.22'")


def unwrap_expert_adapters(peft_model: nn.Module) -> list[str]:
    """Mixture-of-experts models keep their routed experts frozen, without an adapter: returns the experts modules
    whose adapters were taken off.

    With transformers 5, PEFT turns a target named like a checkpoint's expert projection (``gate_proj``, ``up_proj``,
    ``down_proj``, and ``all-linear``, which expands to them) into ``target_parameters`` on the stacked 3-D experts
    (``mlp.experts.gate_up_proj`` ...) and wraps the experts module in ``ParamWrapper`` layers. npu-rl's weight sync,
    merge and vLLM's LoRA path take adapters of linear layers only, so those wrappers are replaced by the experts
    module they wrap, and the adapter's config no longer lists the parameters (nor the rank and alpha the conversion
    set for them). Linear layers that share those names (a DeepSeek-V3 shared expert's or dense layer's
    ``gate_proj``) keep their adapters: PEFT >= 0.22 leaves them targeted (PEFT 0.21 took them off, hence the floor in
    pyproject.toml; docs/moe.md).
    """
    unwrapped = []
    for name, module in list(peft_model.named_modules()):
        if type(module).__name__ != "ParamWrapper" or ".base_layer" in f".{name}.":
            continue  # the outermost wrapper of each experts module only
        inner = module
        while type(inner).__name__ == "ParamWrapper":
            inner = inner.base_layer
        parent_name, _, child = name.rpartition(".")
        setattr(peft_model.get_submodule(parent_name) if parent_name else peft_model, child, inner)
        unwrapped.append(name)
    for config in getattr(peft_model, "peft_config", {}).values():
        fused = {name.rsplit(".", 1)[-1] for name in getattr(config, "target_parameters", None) or ()}
        if fused:
            config.target_parameters = None
            # the conversion's rank and alpha for the fused experts (r x 2 on gate_up_proj) no longer match anything
            patterns = {rf".*\.{re.escape(name)}" for name in fused}
            for attr in ("rank_pattern", "alpha_pattern"):
                table = getattr(config, attr, None)
                if table:
                    setattr(config, attr, {k: v for k, v in table.items() if k not in patterns})
    return unwrapped


# ---------------------------------------------------------------------------------------------- the forward
def use_addmm_forward(model: nn.Module) -> None:
    """Every PEFT LoRA linear of ``model`` runs :func:`addmm_lora_forward` (an instance attribute, so a deep copy
    such as the compute module keeps it, and no other PEFT model in the process is touched)."""
    import types

    from peft.tuners.lora.layer import Linear as LoraLinear

    for _, module in lora_layers(model):
        if type(module) is LoraLinear:
            module.forward = types.MethodType(addmm_lora_forward, module)


def addmm_lora_forward(layer: nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """PEFT's LoRA linear, ``base(x) + B(A(dropout(x))) * scale``, with the adapter's product added into the base
    output by one in-place ``addmm_``. PEFT's own forward makes three passes over the [N, out] output (B's product,
    the scaling, the sum). On a CPU whose bf16 matrix units make the base matmul cheap those memory-bound passes
    are not: for SmolLM2's up projection (976 tokens, 576 -> 1536, bf16, 2 cores) the base matmul took 0.79 ms,
    PEFT's adapter branch 0.64 ms, this one 0.32 ms (docs/benchmarks.md). PEFT's forward still runs whenever this
    one would not be plainly the same: adapter disabled or merged, several active adapters, dropout, a LoRA variant
    (DoRA), a bias on lora_B, autocast, or dtypes that differ (fp32 adapters on a bf16 base: PEFT casts the
    input)."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    active = layer.active_adapters
    name = active[0] if len(active) == 1 else None
    plain = (not args and not kwargs and not layer.disable_adapters and not layer.merged and name in layer.lora_A
             and name not in layer.lora_variant and isinstance(layer.lora_dropout[name], nn.Identity)
             and layer.lora_B[name].bias is None and not torch.is_autocast_enabled(x.device.type))
    if plain:
        a, b = layer.lora_A[name].weight, layer.lora_B[name].weight
        plain = x.dtype == a.dtype == b.dtype == layer.get_base_layer().weight.dtype
    if not plain:
        return LoraLinear.forward(layer, x, *args, **kwargs)
    rows = x.reshape(-1, x.shape[-1])  # [N, in]
    out = layer.base_layer(rows)  # [N, out], a fresh tensor: adding into it in place is safe for autograd
    out.addmm_(torch.nn.functional.linear(rows, a), b.t(), alpha=layer.scaling[name])  # += scale * (x A^T) B^T
    return out.view(*x.shape[:-1], out.shape[-1])


def is_lora_model(model: nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def lora_layers(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


def has_lora_layers(model: nn.Module) -> bool:
    """Whether any PEFT LoRA layer sits in ``model`` (a whole model or one block)."""
    return next(lora_layers(model), None) is not None


def hf_model(model: nn.Module) -> nn.Module:
    """The plain HF model inside a PEFT model (the model itself otherwise)."""
    return model.get_base_model() if is_lora_model(model) else model


@contextlib.contextmanager
def adapter_disabled(model: nn.Module):
    """The base model's behaviour inside the block (the reference policy); a no-op for a model without LoRA."""
    if not is_lora_model(model):
        yield
        return
    with model.disable_adapter():
        yield


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return full_tensor(tensor.detach() if not tensor.requires_grad else tensor)


def _delta(layer: nn.Module, gather: bool) -> torch.Tensor | None:
    """scale * B @ A of the active adapter of a LoRA linear (None when adapters are disabled), in fp32."""
    if layer.disable_adapters or layer.merged:
        return None
    delta = None
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A:
            continue
        a, b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
        if gather:
            a, b = _full(a), _full(b)
        part = (b.float() @ a.float()) * layer.scaling[adapter]
        delta = part if delta is None else delta + part
    return delta


def output_weight(module: nn.Module) -> torch.Tensor:
    """The weight the output layer applies: ``W`` (plain) or ``W + scale * B @ A`` (a LoRA on lm_head, adapter on),
    differentiable in A and B. Used by the swapped lm_head of the log-prob forward (plain and fused kernels)."""
    from peft.tuners.lora import LoraLayer

    if not isinstance(module, LoraLayer):
        return module.weight
    weight = module.get_base_layer().weight
    delta = _delta(module, gather=False)
    return weight if delta is None else weight + delta.to(weight.dtype)


def output_bias(module: nn.Module) -> torch.Tensor | None:
    from peft.tuners.lora import LoraLayer

    base = module.get_base_layer() if isinstance(module, LoraLayer) else module
    return getattr(base, "bias", None)


def has_lora_output_layer(model: nn.Module) -> bool:
    from peft.tuners.lora import LoraLayer

    head = hf_model(model).get_output_embeddings()
    return isinstance(head, LoraLayer)


# ---------------------------------------------------------------------------------------------- weights out
def adapter_tensors(model: nn.Module, *, device: str | torch.device | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(PEFT key, full tensor)`` for every adapter weight, keys as PEFT saves them
    (``base_model.model.<module>.lora_A.weight``). Collective on a sharded model."""
    for name, param in model.named_parameters():
        if "lora_" not in name:
            continue
        key = name.replace(f".{ADAPTER_NAME}.", ".")
        full = _full(param.detach())
        yield key, (full.to(device) if device is not None else full)


def merged_named_weights(model: nn.Module, *, dtype: torch.dtype | None = None,
                         include_tied: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """``(HF name, full tensor)`` of the model with the adapter merged (``W + scale * B @ A`` in fp32, cast back to
    the base dtype or ``dtype``), one tensor at a time, for engines that take plain weights. Collective."""
    from peft.tuners.lora import LoraLayer

    base = hf_model(model)
    seen: set[int] = set()
    lora_prefixes: list[str] = []
    for module_name, module in base.named_modules():
        if any(module_name.startswith(p) for p in lora_prefixes):
            continue
        if isinstance(module, LoraLayer):
            lora_prefixes.append(module_name + ".")
            inner = module.get_base_layer()
            weight = _full(inner.weight.detach())
            delta = _delta(module, gather=True)
            if delta is not None:
                weight = (weight.float() + delta).to(weight.dtype)
            seen.add(id(inner.weight))
            tensors = [("weight", weight)] + ([("bias", _full(inner.bias.detach()))] if inner.bias is not None else [])
        else:
            tensors = []
            for pname, param in module.named_parameters(recurse=False):
                if id(param) in seen and not include_tied:
                    continue
                seen.add(id(param))
                tensors.append((pname, _full(param.detach())))
            for bname, buf in module.named_buffers(recurse=False):
                if buf is not None and bname not in module._non_persistent_buffers_set:
                    tensors.append((bname, _full(buf)))
        for tname, tensor in tensors:
            if dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)
            yield (f"{module_name}.{tname}" if module_name else tname), tensor


def check_resume_adapter(role_dir: str, model_cfg: Any, key: str = "actor_rollout_ref.model") -> None:
    """Before a resume loads anything: the checkpoint's adapter (``role_dir/lora_adapter``) was trained with the
    same ``lora_rank`` as this config asks for (a full-weight checkpoint with none); ``ConfigError`` names the key."""
    spec = LoraSpec.from_config(model_cfg, key)
    adapter = os.path.join(role_dir, "lora_adapter")
    if not os.path.isdir(adapter):
        if spec.enabled:
            raise ConfigError(f"{key}.lora_rank={spec.rank}, but the checkpoint {role_dir} holds full weights (no "
                              f"lora_adapter/): resume it with {key}.lora_rank=0, or start a new run")
        return
    saved = read_adapter_config(adapter)
    if int(saved["r"]) != spec.rank:
        raise ConfigError(f"{key}.lora_rank={spec.rank}, but the checkpoint {role_dir} was trained with "
                          f"lora_rank={saved['r']} ({os.path.join(adapter, ADAPTER_CONFIG)}): resume with "
                          f"{key}.lora_rank={saved['r']}, or start a new run")


def _peft_config(model: nn.Module):
    return model.peft_config[ADAPTER_NAME]


def save_adapter(model: nn.Module, out_dir: str, base_path: str | None = None) -> str:
    """The adapter as a PEFT folder (``adapter_config.json`` + ``adapter_model.safetensors``) written by rank 0;
    ``PeftModel.from_pretrained(base, out_dir)`` loads it. Collective on a sharded model."""
    import torch.distributed as dist
    from safetensors.torch import save_file

    writer = not dist.is_initialized() or dist.get_rank() == 0
    tensors = {k: v.to("cpu").contiguous() for k, v in adapter_tensors(model)}
    if writer:
        os.makedirs(out_dir, exist_ok=True)
        config = _peft_config(model)
        if base_path is not None:
            config.base_model_name_or_path = base_path
        config.save_pretrained(out_dir)
        save_file(tensors, os.path.join(out_dir, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    if dist.is_initialized():
        dist.barrier()
    return out_dir


def load_adapter_model(base_path: str, adapter_path: str, dtype: str | torch.dtype = "fp32") -> nn.Module:
    """A base model folder plus a PEFT adapter folder, checked to fit, as a PEFT model (adapter on, eval mode)."""
    config = read_adapter_config(adapter_path)
    model = load_causal_lm(base_path, dtype=dtype)
    spec = LoraSpec(rank=int(config["r"]), alpha=float(config.get("lora_alpha", 16)),
                    target_modules=config.get("target_modules"), adapter_path=adapter_path, key="adapter")
    check_adapter(adapter_path, model, spec)
    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(model, os.path.expanduser(adapter_path), autocast_adapter_dtype=False)
    unwrap_expert_adapters(peft_model)
    return peft_model.eval()


def merge_adapter(base_path: str, adapter_path: str, out_dir: str, dtype: torch.dtype | None = None,
                  tokenizer: Any = None) -> str:
    """base + adapter -> a plain HF folder with the adapter merged into the weights (``W + scale * B @ A``)."""
    model = load_adapter_model(base_path, adapter_path, dtype="fp32")
    base = hf_model(model)
    state_dict = {name: t.detach().clone() for name, t in merged_named_weights(model, dtype=dtype)}
    return save_hf_state_dict(base.config, state_dict, out_dir, model_class=_hf_class(base), tokenizer=tokenizer)


def export_merged_folder(model: nn.Module, out_dir: str, *, tokenizer: Any = None,
                         dtype: torch.dtype | None = None) -> str:
    """A (sharded) PEFT model as a plain HF folder with the adapter merged, written by rank 0. Collective."""
    import torch.distributed as dist


    writer = not dist.is_initialized() or dist.get_rank() == 0
    state_dict = {}
    for name, tensor in merged_named_weights(model, dtype=dtype):
        if writer:
            state_dict[name] = tensor.to("cpu").clone()
    if writer:
        base = hf_model(model)
        save_hf_state_dict(base.config, state_dict, out_dir, model_class=_hf_class(base), tokenizer=tokenizer)
    if dist.is_initialized():
        dist.barrier()
    return out_dir


def _hf_class(model: nn.Module) -> type:
    return hf_model_class(model)


def check_against_model(model_cfg: Any, key: str = "actor_rollout_ref.model") -> None:
    """Validation-time check, no weights read: on a meta-device skeleton of the model, ``target_modules`` /
    ``exclude_modules`` match some linear layer and the adapter at ``lora_adapter_path`` fits. A built-in model not
    converted yet is skipped (converting it is not a validation's job); the workers check again when they build."""
    spec = LoraSpec.from_config(model_cfg, key)
    if not spec.enabled:
        return
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    path = str(model_cfg.path)
    if is_builtin(path):
        folder = os.path.join(cache_dir(), "models", path.lower())
        if not os.path.isfile(os.path.join(folder, "config.json")):
            return
    else:
        folder = check_model_path(path)  # a Hub id not downloaded yet: checked when the workers build
        if folder is None:
            return
    trust = bool(getattr(model_cfg, "trust_remote_code", False))
    config = AutoConfig.from_pretrained(folder, trust_remote_code=trust)
    for name, value in dict(getattr(model_cfg, "override_config", None) or {}).items():
        setattr(config, name, value)
    auto_class = AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None \
        else AutoModelForCausalLM
    with torch.device("meta"):
        skeleton = auto_class.from_config(config, trust_remote_code=trust)
    resolve_target_modules(skeleton, spec.target_modules, spec.exclude_modules, key)
    if spec.adapter_path and os.path.isdir(os.path.expanduser(spec.adapter_path)):
        check_adapter(spec.adapter_path, skeleton, spec)
