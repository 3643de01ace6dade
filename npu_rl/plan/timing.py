"""Seconds of one RL step, phase by phase: a roofline estimate on a model shape, the job's sizes and a device's
published peaks, with a few efficiency constants measured on one H200 (docs/benchmarks.md, "Planner time
predictions vs measured"). Not a measurement, and never run against an NPU: the Atlas rows use the same constants.

Per device, with ``W`` devices, ``T`` tokens a device trains on, ``R`` of them response tokens (where log-probs are
taken), ``L`` the sequence length:

- **a forward pass** (old log-probs, reference, critic values) takes ``flops / (peak x MATMUL_EFFICIENCY) +
  bytes / bandwidth``: ``flops = 2 T (active decoder matmul parameters) + 2 R hidden x vocab (LM head) + 2 T L
  q_dim x layers`` (causal attention: QK^T and AV at a mean context of L / 2); routed experts' FLOPs run at
  ``EXPERT_EFFICIENCY`` (grouped GEMMs); ``bytes = T layers hidden ELEMENTWISE_BYTES + R vocab LOGIT_BYTES``: the
  unfused elementwise layers (norms, rotary, SiLU-mul, residuals, casts) and the log-prob epilogue over the
  vocabulary, which the H200 profile found to be 40-50% of an update (docs/benchmarks.md, "Where the update's time
  goes").
- **an update** is 3 passes of matmul FLOPs (forward, backward = 2 x forward), 4 with gradient checkpointing (the
  recomputed forward), 2 (+1) with LoRA (no weight gradients for the frozen base), and ``1 + BACKWARD_BYTES_FACTOR
  (+1)`` passes of the elementwise traffic, times ``ppo_epochs``; plus the AdamW step,
  memory-bound: ``OPTIMIZER_BYTES`` per trained parameter (sharded) over HBM, or over the host's memory with
  ``param_offload`` (the step runs on the CPU).
- **a Qwen-VL tower** (npu_rl/plan/vision.py): its matmul FLOPs per patch (window and full attention included) and
  its blocks' elementwise traffic, ``ELEMENTWISE_BYTES`` per hidden element per block as the decoder's, in every
  phase that runs it (:func:`tower_work`; the prefill: :func:`add_prefill_vision_seconds`).
- **FSDP2** (``shard`` > 1): every micro-batch gathers the layers (bf16) once per forward, again for the backward,
  and reduce-scatters the gradients (``reduce_dtype``); these overlap compute, so a pass takes the larger of the two.
  ``param_offload`` adds the shard's host-to-device copy per gather (not overlapped).
- **the host floor**: a micro-batch costs the host (Python, aten dispatch, kernel launches) about the same whatever
  its rows, so a pass of ``M`` micro-batches takes at least ``M x layers x HOST_LAYER_S[kind] (x epochs)``, where
  ``layers`` counts the decoder layers (and a Qwen-VL tower's blocks where the tower runs in each micro-batch; once
  in the pass where it encodes each prompt once) and ``kind`` is a no-grad ``forward`` or an ``update`` (forward +
  backward, + recompute with gradient checkpointing). Each micro-batch takes the larger of its device time and its
  host time, so a training phase takes ``max(compute, communication, host floor) + offload + optimizer``; where the
  floor wins, the phase is ``host (launches)``-bound and larger micro-batches would make it faster.
- **the rollout**: prefill is compute-bound (2 x active parameters x prompt tokens; vLLM prefills a prompt once for
  its ``n`` samples, from its prefix cache); a decode step reads the weights (a mixture of experts: only the experts
  the step's tokens touch, ``E (1 - (1 - k/E)^B)`` per layer for ``B`` tokens) and the KV cache of every row, and
  takes ``max(flops / (peak x DECODE_MATMUL_EFFICIENCY), bytes / (bandwidth x DECODE_BANDWIDTH_EFFICIENCY))`` plus the
  engine's own time per step (Python, scheduling, sampling, kernel launches: ENGINE_STEP), which dominates small
  models. vLLM decodes as many rows at once as its KV cache holds (in waves beyond that); the hf engine decodes all of
  its rows and runs to the longest response. Weight sync (vLLM) moves the bf16 weights at ``SYNC_GB_S`` (a gather
  first under FSDP), and sleep level 1 / wake move them to the host and back at the device's host link.

Efficiencies are measured on the H200 (the constants below say from which row) and assumed for the other kinds:
an H100 differs from an H200 in bandwidth only; the Atlas kinds take their published peaks and the H200's
efficiencies, and their hf engine decodes eagerly (compiled decoding is CUDA-only, ``Backend.compiled_decode``).
The host floor was read on the H200's x86 host and is assumed for every kind, the Atlas kinds' Arm hosts included
(never measured there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from npu_rl.plan.memory import GIB, ModelShape, RolloutSettings, TrainSettings, dtype_bytes
from npu_rl.plan.vision import ImageLoad

# ---------------------------------------------------------------------------------------------- constants
# Measured on one H200 (docs/benchmarks.md); each names the rows it was read from.
MATMUL_EFFICIENCY = 0.80  # the 1.5B update's matmul kernels: ~216 TFLOP in 271 ms = ~800 of 989 TFLOP/s (profile)
EXPERT_EFFICIENCY = 0.19  # one Qwen3-30B-A3B MoE block, grouped_mm, 16,384 tokens: 192 TFLOP/s ("One MoE block")
# HBM traffic of the non-matmul work, per forward: bytes per hidden element per layer per token, and per logit of a
# response token; a backward moves BACKWARD_BYTES_FACTOR times a forward's. Fitted together (least squares over a
# grid of the factor) to the old log-prob forwards and the updates with and without checkpointing of the 0.5B and
# 1.5B shapes (compiled blocks, fused log-probs; 6 rows, each within 11%).
ELEMENTWISE_BYTES = 110.0
LOGIT_BYTES = 34.0
BACKWARD_BYTES_FACTOR = 3.0
OPTIMIZER_BYTES = 44.0  # AdamW fp32 (param, grad, 2 states read and written) + the bf16 copy and grad folding
# A decode step's reads and matmuls without an engine (scripts/gpu/decode_roofline.py on one H200, CUDA graphs, a
# Qwen2.5-7B-shaped stack; docs/results/h200_decode_roofline.jsonl): the bf16 weights read at 0.69-0.74 of the
# bandwidth for 1-128 rows (the KV cache of one layer at 0.76-0.93 once it holds >= 256 MiB); the same matmuls at
# 256 and 512 rows ran at 548 and 614 TFLOP/s (0.55 and 0.62 of the peak).
DECODE_BANDWIDTH_EFFICIENCY = 0.72
DECODE_MATMUL_EFFICIENCY = 0.58
SYNC_GB_S = 9.1  # vLLM weight sync: 0.99 GB in 0.109 s (bench rollout, 0.5B shape, load_weights path)
HOST_ADAM_GB_S = 10.0  # assumed: a rank's share of host memory bandwidth for the CPU AdamW step under param_offload
# engine time per decode step beyond the roofline (seconds): vLLM a fixed part plus a part per running row (its
# scheduler, sampler and log-probs per request; 0.5B shape, 64 rows 4.0 ms, 256 rows 7.3-10.5 ms a step); the hf
# engine a part per decoder layer (kernel launches and Python; 0.5B shape: eager 19-20 ms, compiled 5.8 ms a step)
ENGINE_STEP = {"vllm": (2.0e-3, 0.025e-3, 0.0), "hf_compiled": (0.0, 0.0, 0.23e-3), "hf_eager": (0.0, 0.0, 0.78e-3)}
# Host seconds per decoder layer per micro-batch (Python, aten dispatch, kernel launches), whatever its rows. The
# forward's from the H200 row "0.5B, vLLM, `bench verl` padded, 8-row micro-batches" (docs/benchmarks.md): its old
# log-probs took 0.21-0.23 s for 8 micro-batches x 24 layers, where the roofline puts its device work at 0.06 s:
# 1.15 ms a layer (the hf engine's eager decode, an independent reading, is 0.78 ms a layer a step: ENGINE_STEP).
# An update's is that times its aten ops per layer over the forward's, counted on a CPU (scripts/count_aten_ops.py:
# the 0.5B layer layout, 8 left-padded rows of 160 + 256 tokens, plain log-probs: 80 ops a layer in a no-grad
# forward, 236 in forward + backward, 373 with gradient checkpointing's recompute): 2.95x and 4.66x. Read on the
# H200's x86 host; assumed for every kind, the Atlas kinds' Arm hosts included (never measured there).
FORWARD_HOST_LAYER_S = 1.15e-3
HOST_LAYER_S = {"forward": FORWARD_HOST_LAYER_S, "update": 2.95 * FORWARD_HOST_LAYER_S,
                "update with recompute": 4.66 * FORWARD_HOST_LAYER_S}
SEGMENTS = 16  # decode steps are summed in this many segments of equal length (the context grows linearly)


# ---------------------------------------------------------------------------------------------- the devices
@dataclass(frozen=True)
class DeviceSpeed:
    """A device kind's published peaks and the links a step uses (GB/s = 1e9 bytes/s, per device, one way)."""

    peak_tflops: float  # dense bf16 (Ascend: fp16/bf16 cube) FLOP/s / 1e12
    hbm_tb_s: float
    link_gb_s: float  # intra-node collectives (NVLink, HCCS)
    inter_node_gb_s: float  # collectives that cross nodes (InfiniBand / RoCE per device, A3: the SuperPoD's UB)
    host_link_gb_s: float  # host <-> device copies (sleep / wake, offload)
    compiled_decode: bool  # the hf engine decodes through CUDA graphs here (Backend.compiled_decode)
    measured: bool  # whether the efficiencies were measured on this kind


SPEEDS = {
    # NVIDIA's H200 / H100 SXM datasheets: 989 TFLOP/s dense bf16; 4.8 / 3.35 TB/s HBM; NVLink 900 GB/s both ways;
    # 400 Gb/s InfiniBand per GPU. Host link: sleep + wake moved 2 x 0.99 GB in 0.145 s (bench rollout, H200).
    "h200": DeviceSpeed(989.0, 4.8, 450.0, 50.0, 13.7, True, True),
    "h100": DeviceSpeed(989.0, 3.35, 450.0, 50.0, 13.7, True, False),
    # Ascend 910B (Atlas 800T A2): 313 TFLOP/s fp16 for the 910B3 (the 910B family is quoted at 313-376), 64 GB of
    # HBM2e at 1.6 TB/s; HCCS 7 links of 56 GB/s in an 8-card mesh (~196 GB/s one way assumed for a collective);
    # 200 Gb/s RoCE per NPU between nodes; PCIe 4 x16 to the host (half the H200's measured rate assumed).
    "atlas-a2": DeviceSpeed(313.0, 1.6, 196.0, 25.0, 6.8, False, False),
    # Ascend 910C (Atlas A3): 780 TFLOP/s bf16 and 3.2 TB/s (eight HBM2E stacks) per two-die package (TechPowerUp,
    # 2025-04-21, citing DigiTimes), so ~390 TFLOP/s and 1.6 TB/s per die (the device the runtime shows); the
    # SuperPoD's UB fabric (784 GB/s per package) also between nodes.
    "atlas-a3": DeviceSpeed(390.0, 1.6, 196.0, 196.0, 6.8, False, False),
}


def device_speed(name: str) -> DeviceSpeed | None:
    """The speeds of a planner device kind (None: no time model, e.g. ``cpu``)."""
    return SPEEDS.get(name.lower())


# ---------------------------------------------------------------------------------------------- the work
@dataclass(frozen=True)
class StepWork:
    """What one step computes, from the config (lengths as the planner assumes them: the maxima unless told)."""

    prompts: int  # prompts generated per step, all devices (DAPO: one generation batch, data.gen_batch_size)
    train_prompts: int  # prompts trained on per step (data.train_batch_size)
    n: int  # samples per prompt
    prompt_length: int
    response_length: int  # the mean response length
    max_response_length: int
    packed: bool  # use_remove_padding: training computes real tokens, not the padded maximum
    ppo_epochs: int = 1
    critic_epochs: int = 1
    enforce_eager: bool = False  # rollout.enforce_eager: no compiled hf decoding
    images: ImageLoad | None = None  # a Qwen-VL actor's images (npu_rl/plan/vision.py)


@dataclass
class PhaseTime:
    name: str
    seconds: float
    bound: str  # what limits it: compute, memory, engine, communication, host link, host (launches)
    detail: str = ""


@dataclass
class StepTime:
    device_name: str
    world_size: int
    phases: list[PhaseTime]
    tokens: float  # prompt + response tokens of the trained rows (verl's perf/total_num_tokens)
    rows: int
    measured: bool
    notes: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    @property
    def tokens_per_s_per_device(self) -> float:
        return self.tokens / self.seconds / self.world_size if self.seconds > 0 else 0.0

    def phase(self, prefix: str) -> float:
        """Seconds of the phases whose name starts with ``prefix``."""
        return sum(p.seconds for p in self.phases if p.name.startswith(prefix))

    def table(self) -> str:
        rows = [f"{'phase (roofline estimate)':34s} {'s/step':>8s}  bound"]
        for p in self.phases:
            rows.append(f"{p.name:34s} {p.seconds:8.3f}  {p.bound}" + (f" ({p.detail})" if p.detail else ""))
        return "\n".join(rows + self.notes)

    def verdict(self) -> str:
        where = ("efficiencies measured on one H200" if self.measured else
                 "efficiencies measured on one H200, assumed here (never measured on this device)")
        return (f"time plan (roofline estimate, not a measurement): {self.seconds:.2f} s/step, "
                f"{self.tokens_per_s_per_device:,.0f} tokens/s per device ({self.rows} sequences, "
                f"{self.tokens:,.0f} tokens a step on {self.world_size} device{'s' if self.world_size != 1 else ''}) "
                f"on {self.device_name}; {where}")


# ---------------------------------------------------------------------------------------------- the model's work
def lm_head_params(shape: ModelShape) -> int:
    return shape.vocab_size * shape.hidden_size


def decoder_active_params(shape: ModelShape) -> int:
    """Matmul parameters a token runs through in the decoder layers (an MoE: its ``experts_per_token`` experts)."""
    return shape.num_active_params - shape.root_params


def expert_active_params(shape: ModelShape) -> int:
    """Of those, the routed experts' (they run as grouped GEMMs at their own efficiency)."""
    return shape.num_moe_layers * shape.experts_per_token * shape.expert_params if shape.is_moe else 0


def attention_width(shape: ModelShape) -> int:
    """FLOPs per (query, key) pair per layer / 2 summed over QK^T and AV: the query heads' widths."""
    if shape.mla:
        return shape.num_heads * (shape.qk_nope_head_dim + shape.qk_rope_head_dim + shape.v_head_dim) // 2
    return shape.num_heads * shape.dim


def kv_bytes_per_token(shape: ModelShape) -> int:
    """bf16 KV cache bytes of one token over all layers (MLA: the latent and the rope key)."""
    per_layer = (shape.kv_lora_rank + shape.qk_rope_head_dim) if shape.mla else 2 * shape.kv_dim
    return per_layer * 2 * shape.num_layers


def forward_flops(shape: ModelShape, tokens: float, response_tokens: float, context: float,
                  lm_head: bool = True) -> tuple[float, float]:
    """(dense FLOPs, routed-expert FLOPs) of a forward over ``tokens`` at a mean attention context of ``context``
    keys per query; logits for ``response_tokens``."""
    experts = 2 * tokens * expert_active_params(shape)
    dense = 2 * tokens * (decoder_active_params(shape) - expert_active_params(shape))
    dense += 4 * tokens * context * attention_width(shape) * shape.num_layers
    if lm_head:
        dense += 2 * response_tokens * lm_head_params(shape)
    return dense, experts


def forward_bytes(shape: ModelShape, tokens: float, response_tokens: float, lm_head: bool = True) -> float:
    """HBM traffic of a forward's elementwise layers and log-prob epilogue (the constants above)."""
    logits = response_tokens * shape.vocab_size * LOGIT_BYTES if lm_head else 0.0
    return tokens * shape.num_layers * shape.hidden_size * ELEMENTWISE_BYTES + logits


def experts_touched(shape: ModelShape, tokens: float) -> float:
    """Expected distinct routed experts per MoE layer that ``tokens`` tokens reach (uniform routing)."""
    if not shape.is_moe or tokens <= 0:
        return 0.0
    e, k = shape.num_experts, shape.experts_per_token
    return e * (1 - (1 - k / e) ** tokens)


def decode_weight_bytes(shape: ModelShape, rows: float) -> float:
    """bf16 weight bytes one decode step of ``rows`` rows reads (an MoE: the experts its tokens touch)."""
    if not shape.is_moe:
        return shape.language_params * 2  # the vision tower runs in the prefill only
    unused = shape.num_moe_layers * (shape.num_experts - experts_touched(shape, rows)) * shape.expert_params
    return (shape.language_params - unused) * 2


# ---------------------------------------------------------------------------------------------- the phases
HOST_BOUND = "host (launches)"  # a phase bound by the host floor (HOST_LAYER_S)


def _bound(parts: dict[str, float]) -> str:
    return max(parts.items(), key=lambda kv: kv[1])[0]


def compute_seconds(speed: DeviceSpeed, dense_flops: float, expert_flops: float, hbm_bytes: float) -> float:
    peak = speed.peak_tflops * 1e12
    return (dense_flops / (peak * MATMUL_EFFICIENCY) + expert_flops / (peak * EXPERT_EFFICIENCY)
            + hbm_bytes / (speed.hbm_tb_s * 1e12))


def decode_seconds(shape: ModelShape, speed: DeviceSpeed, engine: str, rows: float, prompt_length: float,
                   steps: int, tensor_parallel: int = 1) -> tuple[float, str]:
    """Seconds of ``steps`` decode steps of ``rows`` rows on a TP group, and what bounds most of them."""
    if steps <= 0 or rows <= 0:
        return 0.0, "none"
    fixed, per_row, per_layer = ENGINE_STEP[engine]
    overhead = fixed + per_row * rows + per_layer * shape.num_layers
    peak, bandwidth = speed.peak_tflops * 1e12, speed.hbm_tb_s * 1e12 * DECODE_BANDWIDTH_EFFICIENCY
    weights = decode_weight_bytes(shape, rows) / tensor_parallel
    total, tally = 0.0, {"compute": 0.0, "memory": 0.0, "engine": 0.0}
    segment = max(1, math.ceil(steps / SEGMENTS))
    for start in range(0, steps, segment):
        count = min(segment, steps - start)
        context = prompt_length + start + (count + 1) / 2  # mean keys per query in this segment
        dense, experts = forward_flops(shape, rows, rows, context)
        compute = (dense / DECODE_MATMUL_EFFICIENCY + experts / EXPERT_EFFICIENCY) / peak / tensor_parallel
        memory = (weights + rows * context * kv_bytes_per_token(shape) / tensor_parallel) / bandwidth
        step = max(compute, memory) + overhead
        total += count * step
        tally["compute" if compute >= memory else "memory"] += count * max(compute, memory)
        tally["engine"] += count * overhead
    return total, _bound(tally)


def rollout_phases(shape: ModelShape, speed: DeviceSpeed, work: StepWork, r: RolloutSettings, world: int, sp: int,
                   kv_cache_bytes: float, actor_shard: int, engine: str) -> list[PhaseTime]:
    """Weight sync / wake / sleep, prefill and decode of one generation batch, per device."""
    tp = max(r.tensor_parallel, 1) if engine == "vllm" else 1
    rows_total = work.prompts * work.n
    phases = []
    weights_bf16 = shape.num_params * 2
    if engine == "vllm":
        engines = max(world // tp, 1)
        rows = rows_total / engines
        prompts = work.prompts / engines
        sync = weights_bf16 / tp / (SYNC_GB_S * 1e9)
        gather = weights_bf16 * (actor_shard - 1) / actor_shard / (speed.link_gb_s * 1e9) if actor_shard > 1 else 0
        move = 0.0
        if r.free_cache_engine and r.sleep_level == 1:
            move = 2 * weights_bf16 / tp / (speed.host_link_gb_s * 1e9)  # to the host at sleep, back at wake
        parts = {"sync": sync, "gather": gather, "host link": move}
        phases.append(PhaseTime("rollout: weight sync, wake, sleep", sum(parts.values()), _bound(parts),
                                f"{weights_bf16 / tp / GIB:.1f} GiB of bf16 weights per device"))
        prefill_tokens, steps = prompts * work.prompt_length, work.response_length
        per_row_kv = (work.prompt_length + work.response_length) * kv_bytes_per_token(shape)
        concurrent = max(1.0, min(rows, kv_cache_bytes * tp / per_row_kv)) if kv_cache_bytes > 0 else rows
    else:
        dp = max(world // max(sp, 1), 1)
        rows = rows_total / dp
        gather = weights_bf16 * (actor_shard - 1) / actor_shard / (speed.link_gb_s * 1e9) if actor_shard > 1 else 0
        if gather:
            phases.append(PhaseTime("rollout: gather the weights", gather, "communication"))
        prefill_tokens, steps, concurrent = rows * work.prompt_length, work.max_response_length, rows
    dense, experts = forward_flops(shape, prefill_tokens, 0, work.prompt_length / 2, lm_head=False)
    prefill = compute_seconds(speed, dense / tp, experts / tp, 0.0)
    phases.append(PhaseTime("rollout: prefill", prefill, "compute", f"{prefill_tokens:,.0f} prompt tokens"))
    waves = math.ceil(rows / concurrent - 1e-9)
    per_wave = rows / waves
    decode, bound = decode_seconds(shape, speed, engine, per_wave, work.prompt_length, steps, tp)
    detail = f"{engine}, {steps} steps x {per_wave:,.0f} rows" + (f" x {waves} waves (KV cache)" if waves > 1 else "")
    phases.append(PhaseTime("rollout: decode", decode * waves, bound, detail))
    return phases


def _gather_seconds(shape: ModelShape, s: TrainSettings, speed: DeviceSpeed, devices_per_node: int,
                    dtype: str) -> float:
    """One all-gather (or reduce-scatter) of the whole model in ``dtype`` across the FSDP2 group, per device."""
    if s.shard <= 1:
        return 0.0
    link = speed.link_gb_s if s.shard <= devices_per_node else speed.inter_node_gb_s
    return shape.num_params * dtype_bytes(dtype) * (s.shard - 1) / s.shard / (link * 1e9)


def host_kind(update: bool, gradient_checkpointing: bool) -> str:
    """The :data:`HOST_LAYER_S` key of a pass: a no-grad forward, or an update (with the recompute when on)."""
    if not update:
        return "forward"
    return "update with recompute" if gradient_checkpointing else "update"


@dataclass(frozen=True)
class TowerWork:
    """A Qwen-VL vision tower's share of a training phase: its matmul FLOPs over the phase (every pass and epoch),
    its blocks, and whether it runs in every micro-batch (``per_micro_batch``) or once in the phase (each prompt
    encoded once); ``kind`` is the :data:`HOST_LAYER_S` key of its calls."""

    flops: float
    blocks: int
    per_micro_batch: bool
    kind: str
    hbm_bytes: float = 0.0  # its blocks' elementwise traffic (tower_bytes_per_patch), every pass and epoch


def train_phase(name: str, shape: ModelShape, s: TrainSettings, speed: DeviceSpeed, devices_per_node: int, *,
                tokens: float, response_tokens: float, context: float, update: bool, lm_head: bool = True,
                epochs: int = 1, tower: TowerWork | None = None) -> PhaseTime:
    """A forward pass (``update`` False) or an update over ``tokens`` per device, in micro-batches; ``tower``: a
    Qwen-VL actor's vision tower in this phase."""
    dense, experts = forward_flops(shape, tokens, response_tokens, context, lm_head)
    hbm = forward_bytes(shape, tokens, response_tokens, lm_head)
    passes, byte_passes = 1, 1.0  # forward-equivalents of matmul FLOPs and of elementwise traffic
    if update:
        recompute = 1 if s.gradient_checkpointing else 0
        passes = (2 if s.lora_rank else 3) + recompute  # LoRA: no weight gradients for the frozen base
        byte_passes = 1 + BACKWARD_BYTES_FACTOR + recompute
    compute = (compute_seconds(speed, dense, experts, 0.0) * passes
               + compute_seconds(speed, 0.0, 0.0, hbm) * byte_passes) * epochs
    micro_tokens = (s.micro_tokens if update else s.forward_tokens) / max(s.sp, 1)
    micro_batches = max(1, math.ceil(tokens / micro_tokens)) if micro_tokens > 0 else 1
    # the host floor: every micro-batch launches every layer's kernels, whatever its rows (HOST_LAYER_S)
    kind = host_kind(update, s.gradient_checkpointing)
    layer_calls = micro_batches * epochs * shape.num_layers
    host = layer_calls * HOST_LAYER_S[kind]
    if tower is not None:
        compute += compute_seconds(speed, tower.flops, 0.0, tower.hbm_bytes)
        tower_calls = micro_batches * epochs if tower.per_micro_batch else 1
        host += tower_calls * tower.blocks * HOST_LAYER_S[tower.kind]
    gathers = (2 if update else 1) * micro_batches * epochs
    comm = gathers * _gather_seconds(shape, s, speed, devices_per_node, s.param_dtype)
    if update and not s.lora_rank:
        comm += micro_batches * epochs * _gather_seconds(shape, s, speed, devices_per_node, s.reduce_dtype)
    offload = 0.0
    if s.param_offload:
        offload = gathers * shape.num_params * dtype_bytes(s.model_dtype) / max(s.shard, 1) / (
            speed.host_link_gb_s * 1e9)
    parts = {"compute": compute, "communication": comm, HOST_BOUND: host, "host link": offload}
    seconds = max(compute, comm, host) + offload
    if update:
        trained = (shape.lora_params(s.lora_rank) if s.lora_rank else
                   shape.num_params - (shape.vision_params if s.freeze_vision else 0))
        step_bytes = trained * OPTIMIZER_BYTES * dtype_bytes(s.model_dtype) / 4 / max(s.shard, 1)
        optimizer = step_bytes / ((HOST_ADAM_GB_S * 1e9) if s.param_offload else speed.hbm_tb_s * 1e12) * epochs
        parts["optimizer"] = optimizer
        seconds += optimizer
    detail = f"{micro_batches} micro-batch{'es' if micro_batches > 1 else ''}" + (
        f" x {passes} passes" if update else "") + (f" x {epochs} epochs" if epochs > 1 else "")
    if tower is not None:
        detail += f"; vision {tower.flops / 1e12:,.1f} TFLOP"
    if host > max(compute, comm):
        detail += (f"; host-bound: {layer_calls:,} layer calls x {HOST_LAYER_S[kind] * 1e3:.2f} ms"
                   + (" + the vision tower's" if tower is not None else "")
                   + f" = {host:.3g} s > {max(compute, comm):.3g} s on the device; "
                   + ("larger micro-batches would help" if micro_batches > 1 else
                      "one micro-batch already: the model is too small to keep the device busy"))
    return PhaseTime(name, seconds, _bound(parts), detail)


def vision_patches_per_phase(shape: ModelShape, actor: TrainSettings, work: StepWork, world: int,
                             rollout: RolloutSettings) -> dict[str, tuple[float, int]]:
    """Per device: (patches through the vision tower, forward-equivalent passes) of each phase whose name starts
    with the key. Encoded once (transformers >= 5.19): a pass covers each prompt once; handed pixels, each micro-batch
    its distinct prompts' (the tower's dedup: ``vision_*_share`` of the rows, npu_rl/plan/job.py vision_settings),
    or every row (``per-row``). vLLM encodes a prompt's images once for its ``n`` samples (its encoder cache is keyed
    by the image); the hf rollout's prefill once per prompt encoded once or with the dedup."""
    images = work.images
    per_prompt = images.patches_per_prompt
    prompts, rows = work.train_prompts * per_prompt / world, work.train_prompts * work.n * per_prompt / world
    gen_prompts = work.prompts * per_prompt / world
    once = images.encode_once
    hf_once = (once and actor.shard == 1) or images.dedup
    generate = gen_prompts if rollout.engine == "vllm" or hf_once else gen_prompts * work.n
    trained = not actor.freeze_vision and not actor.lora_rank
    if trained:
        update = (rows * actor.vision_update_share, (3 + (1 if actor.gradient_checkpointing else 0)) * work.ppo_epochs)
    else:
        update = (prompts, 1) if once else (rows * actor.vision_update_share, work.ppo_epochs)
    logprobs = prompts if once else rows * actor.vision_forward_share  # the reference's micro-batches taken alike
    return {"rollout: prefill": (generate, 1), "actor log-probs": (logprobs, 1), "reference log-probs": (logprobs, 1),
            "actor update": update}


def tower_work(shape: ModelShape, actor: TrainSettings, work: StepWork, world: int,
               rollout: RolloutSettings) -> dict[str, TowerWork]:
    """The vision tower's share of each training phase, by phase name (:func:`vision_patches_per_phase`'s FLOPs).
    It runs in every micro-batch where it is handed pixels (a trained tower's update; every pass without
    ``encode_once``) and once in the phase where each prompt is encoded once; a trained tower's calls take the
    update's backward (and recompute), the others are no-grad forwards."""
    per_patch = shape.vision.forward_flops_per_patch(work.images.patches_per_image)
    bytes_per_patch = tower_bytes_per_patch(shape)
    once = work.images.encode_once
    trained = not actor.freeze_vision and not actor.lora_rank
    runs = {"actor log-probs": (not once, "forward"), "reference log-probs": (not once, "forward"),
            "actor update": (True, host_kind(True, actor.gradient_checkpointing)) if trained else (not once,
                                                                                                 "forward")}
    # elementwise traffic: a forward's per no-grad pass; a trained tower's update moves 1 + BACKWARD_BYTES_FACTOR
    # (+ 1 recomputed) forwards' worth an epoch, as the decoder's (train_phase)
    recompute = 1 if actor.gradient_checkpointing else 0
    update_byte_passes = (1 + BACKWARD_BYTES_FACTOR + recompute) * work.ppo_epochs
    works = {}
    for name, (patches, passes) in vision_patches_per_phase(shape, actor, work, world, rollout).items():
        if name not in runs or not patches:
            continue
        byte_passes = update_byte_passes if name == "actor update" and trained else passes
        works[name] = TowerWork(per_patch * patches * passes, shape.vision.depth, *runs[name],
                                hbm_bytes=bytes_per_patch * patches * byte_passes)
    return works


def tower_bytes_per_patch(shape: ModelShape) -> float:
    """HBM traffic of one patch's forward through a Qwen-VL tower's blocks beyond its matmuls: the blocks have the
    decoder layers' elementwise structure (norms, rotary, the gated MLP's activation, residuals, casts), so
    ``ELEMENTWISE_BYTES`` per hidden element per block, as :func:`forward_bytes` counts for the decoder."""
    return shape.vision.depth * shape.vision.hidden_size * ELEMENTWISE_BYTES


def add_prefill_vision_seconds(phases: list[PhaseTime], shape: ModelShape, actor: TrainSettings, speed: DeviceSpeed,
                               work: StepWork, world: int, rollout: RolloutSettings) -> None:
    """The vision tower's matmul FLOPs (at MATMUL_EFFICIENCY) and elementwise traffic (:func:`tower_bytes_per_patch`)
    added to the rollout's prefill; the training phases take theirs in :func:`train_phase` (:func:`tower_work`)."""
    per_patch = shape.vision.forward_flops_per_patch(work.images.patches_per_image)
    patches, passes = vision_patches_per_phase(shape, actor, work, world, rollout)["rollout: prefill"]
    for phase in phases:
        if phase.name == "rollout: prefill" and patches:
            flops = per_patch * patches * passes
            phase.seconds += compute_seconds(speed, flops, 0.0, tower_bytes_per_patch(shape) * patches * passes)
            phase.detail += ("; " if phase.detail else "") + f"vision {flops / 1e12:,.1f} TFLOP"


def engine_kind(rollout: RolloutSettings, speed: DeviceSpeed, work: StepWork) -> str:
    if rollout.engine == "vllm":
        return "vllm"
    return "hf_compiled" if speed.compiled_decode and not work.enforce_eager else "hf_eager"


def step_time(*, actor_shape: ModelShape, actor: TrainSettings, ref: TrainSettings | None, ref_in_actor: bool,
              use_ref: bool, critic_shape: ModelShape | None, critic: TrainSettings | None,
              rollout: RolloutSettings, world: int, devices_per_node: int, work: StepWork, device: str,
              device_name: str, kv_cache_bytes: float) -> StepTime | None:
    """The phases of one step on ``device`` (a planner device kind); None where there is no time model."""
    speed = device_speed(device)
    if speed is None:
        return None
    engine = engine_kind(rollout, speed, work)
    phases = rollout_phases(actor_shape, speed, work, rollout, world, actor.sp, kv_cache_bytes, actor.shard, engine)
    rows = work.train_prompts * work.n
    response = work.response_length if work.packed else work.max_response_length
    seq = work.prompt_length + response
    tokens, response_tokens = rows * seq / world, rows * response / world
    args = dict(tokens=tokens, response_tokens=response_tokens, context=seq / 2)
    vision = actor_shape.vision is not None and work.images is not None
    towers = tower_work(actor_shape, actor, work, world, rollout) if vision else {}
    phases.append(train_phase("actor log-probs", actor_shape, actor, speed, devices_per_node, update=False,
                              tower=towers.get("actor log-probs"), **args))
    if use_ref:
        phases.append(train_phase("reference log-probs", actor_shape, ref if ref is not None and not ref_in_actor
                                  else actor, speed, devices_per_node, update=False,
                                  tower=towers.get("reference log-probs"), **args))
    if critic is not None and critic_shape is not None:
        phases.append(train_phase("critic values", critic_shape, critic, speed, devices_per_node, update=False,
                                  lm_head=False, **args))
        phases.append(train_phase("critic update", critic_shape, critic, speed, devices_per_node, update=True,
                                  lm_head=False, epochs=work.critic_epochs, **args))
    phases.append(train_phase("actor update", actor_shape, actor, speed, devices_per_node, update=True,
                              epochs=work.ppo_epochs, tower=towers.get("actor update"), **args))
    if vision:
        add_prefill_vision_seconds(phases, actor_shape, actor, speed, work, world, rollout)
    notes = []
    if work.prompts != work.train_prompts:
        notes.append(f"(one generation batch of {work.prompts} prompts; dynamic sampling may generate up to "
                     "max_num_gen_batches of them a step)")
    if work.response_length < work.max_response_length:
        notes.append(f"(responses of {work.response_length} tokens on average, at most {work.max_response_length})")
    return StepTime(device_name, world, phases, rows * (work.prompt_length + work.response_length), rows,
                    speed.measured, notes)
