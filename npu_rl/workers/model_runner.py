"""Under the training engine (:mod:`npu_rl.workers.engine`): a model on this rank's device (sharded when the world
is larger than one), a batch split into micro-batches (fixed size or a token budget), forward inputs with the
padding trimmed.

Trimming: prompts are left-padded to ``max_prompt_length`` and responses right-padded to ``max_response_length``,
so most micro-batches carry columns of padding on both sides. Columns that are padding in every row are cut before
the forward and the outputs padded back, which changes no value (attention masks exclude those columns) and on
short prompts saves most of the work.
"""

from __future__ import annotations

import copy
import types
from dataclasses import dataclass

import torch

from npu_rl.device import get_backend
from npu_rl.parallel.expert_parallel import check_expert_parallel
from npu_rl.utils.dtypes import to_dtype
from npu_rl.protocol import Batch
from npu_rl.models.compiled_experts import compile_experts
from npu_rl.models.loader import resolve_model_path
from npu_rl.models.lora import has_lora_layers
from npu_rl.parallel import apply_fsdp2_from_config, build_mesh, dist
from npu_rl.parallel.attention import use_varlen_attention
from npu_rl.parallel.dist import default_group
from npu_rl.parallel.fsdp import FSDPSettings, mesh_ep_size, mesh_fsdp_size, optimizer_step
from npu_rl.parallel.seqlen import restore_order as restore, split_by_token_budget
from npu_rl.parallel.sharded_load import has_safetensors, load_sharded_weights, real_tensors


@dataclass
class MicroBatching:
    micro_batch_size: int | None = None  # rows per micro-batch (None: the whole batch)
    use_dynamic_bsz: bool = False
    max_token_len: int = 16384  # token budget per micro-batch when use_dynamic_bsz


def split_micro_batches(batch: Batch, how: MicroBatching) -> tuple[list[Batch], list[list[int]] | None]:
    """Micro-batches, and (for token-budget batches, which regroup rows) the row partition to restore order.
    With several ranks, every rank gets the same number of token-budget micro-batches: each forward of a sharded
    model is a collective, so the counts must agree."""
    if how.use_dynamic_bsz:
        return split_by_token_budget(batch, how.max_token_len, dp_group=default_group())
    size = how.micro_batch_size or len(batch)
    return batch.split(size), None


def restore_order(outputs: list[torch.Tensor], partitions: list[list[int]] | None) -> torch.Tensor:
    """Concatenate micro-batch outputs and undo a token-budget regrouping."""
    if partitions is None:
        return torch.cat(outputs)

    return restore(outputs, partitions)


def trimmed_inputs(mb: Batch, response_length: int) -> tuple[dict[str, torch.Tensor], int]:
    """Forward inputs with all-padding columns cut; returns them and the kept response width."""
    attention_mask = mb["attention_mask"]  # [b, P + R]
    prompt_width = attention_mask.shape[1] - response_length
    prompt_valid = attention_mask[:, :prompt_width].any(dim=0)
    first = int(prompt_valid.nonzero()[0]) if prompt_valid.any() else prompt_width - 1
    response_valid = mb["response_mask"].any(dim=0) if "response_mask" in mb else attention_mask[:, prompt_width:].any(0)
    kept = int(response_valid.nonzero()[-1]) + 1 if response_valid.any() else 1
    cols = slice(first, prompt_width + kept)
    inputs = {k: mb[k][..., cols] for k in ("input_ids", "attention_mask", "position_ids")}  # position_ids: [b, (3,) T]
    inputs["responses"] = mb["responses"][:, :kept]
    if "routed_experts" in mb:  # [b, P + R, L, K]: router replay (npu_rl/models/moe.py)
        inputs["routed_experts"] = mb["routed_experts"][:, cols]
    return inputs, kept


def pad_right(values: torch.Tensor, width: int) -> torch.Tensor:
    """[b, kept, ...] -> [b, width, ...] with zeros."""
    if values.shape[1] == width:
        return values
    return torch.nn.functional.pad(values, (0, 0) * (values.dim() - 2) + (0, width - values.shape[1]))


def shared_compute_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """The compute copy of a partly frozen model (a LoRA base): frozen parameters and all buffers are shared with
    ``model`` (no second copy of the base), only the trainable parameters are copied, in ``dtype``; so the adapter
    branch runs in the compute dtype while the optimizer keeps fp32 adapters."""
    memo = {id(p): p for p in model.parameters() if not p.requires_grad}
    memo.update({id(b): b for b in model.buffers()})
    compute = copy.deepcopy(model, memo)
    for param in compute.parameters():
        if param.requires_grad:
            param.data = param.data.to(dtype)
    return compute


def cast_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``copy.deepcopy(model).to(dtype)`` without first copying every weight in the master's dtype: each floating
    parameter is cast once into the copy (deepcopy's memo maps a tied parameter once, so ties stay tied), then
    ``.to`` casts the floating buffers as before. On one CPU the compute copy of SmolLM2-135M took 1.9-2.3 s
    this way round and 0.1-0.5 s cast first; on a device it also spares a transient second master-dtype copy."""
    memo = {id(p): torch.nn.Parameter(p.detach().to(dtype) if p.is_floating_point() else p.detach().clone(),
                                      requires_grad=p.requires_grad) for p in model.parameters()}
    return copy.deepcopy(model, memo).to(dtype)


def compile_elementwise_blocks(model: torch.nn.Module) -> int:
    """``torch.compile`` (in place: ``nn.Module.compile``, names and state dicts unchanged) every RMSNorm and every
    decoder layer's MLP, so that their elementwise work (the fp32 upcast, variance, rsqrt and scale of RMSNorm; the
    SiLU-and-multiply of SwiGLU) runs as fused kernels around the matmuls, forward and backward. The profile of the
    update on the H200 (docs/benchmarks.md) put unfused elementwise work at 19-25% of its time. Attention stays
    eager (the packed path carries a per-batch layout). Blocks holding LoRA layers are left alone. Mixture of
    experts: the experts modules compile with symbolic token counts, one graph for every batch length
    (:func:`npu_rl.models.compiled_experts.compile_experts`; the routers stay eager for replay), and the shared
    experts' MLPs (``shared_experts`` / ``shared_expert``) as the dense MLPs. Returns how many blocks were
    compiled.

    Each block sees its input as rows ``[N, hidden]`` (:func:`compile_on_rows`): every RMSNorm of a model shares
    one code object and so one cache of graphs, and under torch's defaults each input rank (the language model's
    ``[B, T, H]``, Qwen3's per-head q/k norms ``[B, T, heads, D]``, a vision tower's ``[patches, H]``), grad mode
    and size-1 dimension (one-token decode, one row) cost a graph, twice (static first, symbolic on the first
    change). The H100 runs of a 4-layer Qwen3-MoE and a Qwen2.5-VL GRPO step (2026-12-07) hit dynamo's limit of 8
    graphs a function that way, after which the rest ran eager. On rows, with symbolic row counts from the first
    call, a block class needs a graph per width (parameters keep static shapes: Qwen3's hidden and head norms, a
    vision tower's), grad mode and ``N == 1`` or not; dynamo's limit is raised to :data:`RECOMPILE_LIMIT` a
    function (process-wide, as torch keeps it; never lowered) so that no variant falls back to eager
    (tests/e2e/test_compile_blocks.py counts them)."""
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
    count = 0
    for name, module in model.named_modules():
        kind = type(module).__name__
        mlp = name.rpartition(".")[2] in ("mlp", "shared_experts", "shared_expert") and kind.endswith("MLP")
        if (kind.endswith("RMSNorm") or mlp) and not has_lora_layers(module):
            compile_on_rows(module)
            count += 1
    return count + compile_experts(model)


def compile_on_rows(module: torch.nn.Module) -> None:
    """Compile ``module`` (an RMSNorm or an MLP: both act on the last dimension alone) in place, run on its input
    flattened to rows: ``forward(x)`` becomes ``compiled(module, x.reshape(-1, x.shape[-1])).view(*x.shape[:-1],
    -1)``, the reshape and view eager (free for a contiguous input); ``compiled`` is the class's forward under
    ``torch.compile(dynamic=True)``, one cache of graphs for every instance. A call with more than the one tensor (a
    gated norm's ``gate``) runs the compiled forward as it is. Names, parameters and state dicts are unchanged, and a
    deep copy calls its own weights (the forward is a bound method)."""
    forward = type(module).forward
    if forward not in _COMPILED_FORWARDS:
        _COMPILED_FORWARDS[forward] = torch.compile(forward, dynamic=True)
    module.forward = types.MethodType(_forward_on_rows, module)


def is_compiled_block(module: torch.nn.Module) -> bool:
    """Whether :func:`compile_elementwise_blocks` compiled ``module`` (on rows, or in place as the experts)."""
    return (getattr(module, "_compiled_call_impl", None) is not None
            or getattr(module.forward, "__func__", None) is _forward_on_rows)


RECOMPILE_LIMIT = 32  # graphs a compiled function may hold (torch's default: 8); see compile_elementwise_blocks
_COMPILED_FORWARDS: dict = {}  # a block class's forward -> its torch.compile wrapper


def _forward_on_rows(self: torch.nn.Module, hidden_states, *args, **kwargs):
    compiled = _COMPILED_FORWARDS[type(self).forward]
    if args or kwargs or not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() < 2:
        return compiled(self, hidden_states, *args, **kwargs)
    shape = hidden_states.shape
    return compiled(self, hidden_states.reshape(-1, shape[-1])).view(*shape[:-1], -1)


def sharded_load_folder(path: str) -> str | None:
    """Where a training role reads its weights shard by shard, or None for a plain load. Sharded when there are
    several ranks and the model folder stores safetensors (the embedded SmolLM2's converted cache folder does):
    the role then builds its model on the meta device (``device="meta"`` in models/loader.py) and hands this folder
    to :class:`ModelRunner`, which parallelises the meta model and reads each rank's slices
    (:mod:`npu_rl.parallel.sharded_load`). A folder of ``*.bin`` weights keeps the plain load on every rank."""
    dist.init_distributed(single_process_group=False)
    folder = resolve_model_path(path)
    return folder if dist.world_size() > 1 and has_safetensors(folder) else None


def is_on_meta(model: torch.nn.Module) -> bool:
    return any(p.device.type == "meta" for p in model.parameters())


class ModelRunner:
    """A model on this rank's device with its precision and parallel settings: with more than one rank it is sharded
    here (FSDP2 per decoder layer over the mesh, ``apply_fsdp2_from_config``); alone, it is moved to the device.

    A model built on the meta device (``weights_folder`` given) is parallelised first and then filled with this
    rank's shards read from ``weights_folder`` (:func:`sharded_load_folder`); ``init_seed`` draws the parameters
    no file holds (a critic's value head).

    Precision: ``fsdp_config.model_dtype`` is the dtype of the weights the optimizer updates and checkpoints hold
    (fp32 by default), ``mixed_precision.param_dtype`` the dtype forwards and backwards run in (bf16 by default).
    Sharded (world > 1), FSDP2's MixedPrecisionPolicy casts on every all-gather. On one device the same split is
    kept with two modules: ``model`` (the fp32 master: optimizer, checkpoints, weight sync) and ``compute_model``
    (a bf16 copy that runs forward/backward); ``grads_to_master`` and ``master_to_compute`` move gradients and
    weights between them around the optimizer step. Updating bf16 weights directly would round most AdamW steps
    of a 1e-6..1e-5 learning rate away (bf16 keeps 8 bits of mantissa).
    """

    def __init__(self, model: torch.nn.Module, fsdp_config, trainable: bool = True, sp_size: int = 1,
                 use_remove_padding: bool = False, compile_blocks: bool = False, weights_folder: str | None = None,
                 init_seed: int = 0):
        self.backend = get_backend()
        self.device = self.backend.device()
        self.param_dtype = to_dtype(fsdp_config.mixed_precision.param_dtype)
        self.world_size = dist.world_size()

        self.fsdp_settings = FSDPSettings.from_config(fsdp_config)
        # Ulysses needs the packed (varlen) forward too: the sequence is split after padding is removed.
        self.packed = use_remove_padding or sp_size > 1
        if self.packed:
            use_varlen_attention(model)
        self.mesh = None
        if is_on_meta(model) and (weights_folder is None or self.world_size == 1):
            raise ValueError("a model built on the meta device is loaded shard by shard: give weights_folder "
                             "(several ranks only; see sharded_load_folder)")
        if self.world_size > 1:
            ep_size = mesh_ep_size(fsdp_config)
            check_expert_parallel(model.config, ep_size)
            self.mesh = build_mesh(sp_size=sp_size, fsdp_size=mesh_fsdp_size(fsdp_config), ep_size=ep_size)
            kept = real_tensors(model) if weights_folder is not None else None  # buffers, adapters: full values
            self.model = apply_fsdp2_from_config(model, fsdp_config, sp_size=sp_size, mesh=self.mesh)
            if weights_folder is not None:
                load_sharded_weights(self.model, weights_folder, self._shard_device(), seed=init_seed, keep=kept,
                                     buffer_device=self.device)
            self.compute_model = self.model
            self.compiled_blocks = self._compile(compile_blocks)
            return
        if sp_size > 1:
            raise ValueError(f"ulysses_sequence_parallel_size={sp_size} needs as many devices; this worker is alone")
        if mesh_ep_size(fsdp_config) > 1:
            raise ValueError(f"fsdp_config.expert_parallel_size={mesh_ep_size(fsdp_config)} needs as many devices; "
                             "this worker is alone")
        self.model = model.to(self.device)
        if {p.dtype for p in model.parameters()} == {self.param_dtype}:
            self.compute_model = self.model
        elif trainable and any(not p.requires_grad for p in model.parameters()):
            self.compute_model = shared_compute_copy(self.model, self.param_dtype)  # LoRA: a frozen base is shared
        elif trainable:
            self.compute_model = cast_copy(self.model, self.param_dtype)
        else:  # nothing to update: keep only the compute copy
            self.model = self.compute_model = self.model.to(self.param_dtype)
        self.compiled_blocks = self._compile(compile_blocks)

    def _shard_device(self) -> torch.device:
        """Where the shards live: the device, or host memory with ``param_offload``."""
        return torch.device("cpu") if self.fsdp_settings.param_offload else self.device

    def _compile(self, asked: bool) -> int:
        """The compute model's elementwise blocks compiled where the device layer allows it (``use_torch_compile``)."""
        if not (asked and self.backend.compiles_model_blocks):
            return 0
        return compile_elementwise_blocks(self.compute_model)

    @property
    def dp_size(self) -> int:
        return self.mesh.dp_size if self.mesh is not None else 1

    @property
    def dp_group(self):
        return self.mesh.dp_group if self.mesh is not None else None

    @property
    def sp_group(self):
        return self.mesh.sp_group if self.mesh is not None else None

    def dispatch_layout(self):
        """For DP_SPLIT: ranks of one Ulysses group share a data shard (None: every rank its own)."""
        return self.mesh.dispatch_layout() if self.mesh is not None else None

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()``; with ``fsdp_config.optimizer_offload`` the states come to the device for the step
        and go back to host memory after it."""
        optimizer_step(optimizer, self.fsdp_settings)
        self.master_to_compute()

    @property
    def has_master_copy(self) -> bool:
        return self.compute_model is not self.model

    def grads_to_master(self) -> None:
        """Add the compute copy's gradients to the master weights' (in fp32) and clear them: called after every
        micro-batch's backward, so accumulation over micro-batches happens in fp32, not bf16."""
        if not self.has_master_copy:
            return
        pairs = [(m, c) for m, c in zip(self.model.parameters(), self.compute_model.parameters())
                 if c.grad is not None and c is not m]  # a shared (frozen LoRA base) parameter has no grad anyway
        accumulate = [(m, c) for m, c in pairs if m.grad is not None]
        for master, compute in pairs:
            if master.grad is None:
                master.grad = compute.grad.to(master.dtype)
        if accumulate:  # the master-dtype gradients read the compute copy's as they are: no cast copy of all of
            # them (4 bytes a parameter that a `c.grad.to(m.dtype)` list held at once; foreach's per-tensor route
            # for mixed dtypes casts inside each add's kernel)
            torch._foreach_add_([m.grad for m, _ in accumulate], [c.grad for _, c in accumulate])
        for _, compute in pairs:
            compute.grad = None

    @torch.no_grad()
    def master_to_compute(self) -> None:
        """Copy the updated master weights into the compute copy."""
        if not self.has_master_copy:
            return
        pairs = [(m, c) for m, c in zip(self.model.parameters(), self.compute_model.parameters())
                 if c is not m]  # LoRA: the shared base is not copied onto itself
        if pairs:
            torch._foreach_copy_([c for _, c in pairs], [m for m, _ in pairs])

    def train(self) -> None:
        self.compute_model.train()

    def eval(self) -> None:
        self.compute_model.eval()
