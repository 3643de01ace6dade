"""A config read into the memory arithmetic (:mod:`npu_rl.plan.memory`): the phases of one step on one device, the
peak, whether it fits the named device, and the one or two keys that would make it fit.

Model shapes come from each model's ``config.json`` (no weights are read): a local folder, the embedded model's
converted cache folder, a Hub or ModelScope id's cached snapshot, or, for an id that is not on this machine, a local
``config.json`` given with ``model_config`` (``npu-rl plan --model-config FILE``): :mod:`npu_rl.plan.model_shape`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from typing import Callable, NamedTuple

from npu_rl.config.derived import derive_run_settings
from npu_rl.core import estimator_needs
from npu_rl.device import get_backend
from npu_rl.models.loader import is_builtin, local_model_folder
from npu_rl.models.vision_dedup import vision_dedup_enabled
from npu_rl.plan.memory import (
    GIB,
    dtype_bytes,
    DeviceSpec,
    ModelShape,
    Phase,
    RoleMemory,
    RolloutSettings,
    TrainSettings,
    DEVICES,
    device_spec,
    rollout_asleep,
    rollout_counted_asleep,
    rollout_awake,
)
from npu_rl.plan.model_shape import model_shape
from npu_rl.plan.timing import StepTime, StepWork, step_time
from npu_rl.plan.vision import (VISION_ENCODE_MODES, ImageLoad, VisionShape, image_load, parse_image_size,
                                pixel_bounds, prompts_in_micro_batch, transformers_encodes_once)

PROCESS_HOST_GIB = 4.0  # one worker process's host memory before any model (torch, the runtime, Ray's worker)


# ---------------------------------------------------------------------------------------------- the plan
@dataclass
class JobPlan:
    device: DeviceSpec
    world_size: int
    devices_per_node: int
    phases: list[Phase]
    host_per_node_bytes: float
    host_parts: dict[str, float] = field(default_factory=dict)
    fixes: list[str] = field(default_factory=list)  # keys that would make it fit (empty when it fits)
    model_lines: list[str] = field(default_factory=list)  # parameters, experts, EP shards (moe_summary)
    time: StepTime | None = None  # seconds per phase (npu_rl/plan/timing.py); None for a device with no time model
    counted_asleep_bytes: float = 0.0  # a sleeping vLLM's tensors torch still counts (memory.rollout_counted_asleep)

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.bytes)

    @property
    def allocated_counter_gib(self) -> float:
        """The peak torch's allocated counter should report (``perf/max_memory_allocated_gb``): the phases' device
        bytes, plus, in every phase but the rollout, the sleeping engine's unmapped tensors it still counts."""
        return max(p.bytes + (self.counted_asleep_bytes if p.name != "rollout" else 0.0)
                   for p in self.phases) / GIB

    @property
    def fits(self) -> bool:
        return self.peak.gib <= self.device.memory_gib

    @property
    def host_fits(self) -> bool:
        return self.host_per_node_bytes / GIB <= self.device.host_memory_gib

    def verdict(self) -> str:
        """One line: the peak phase, the device, fits or not and what would make it fit."""
        peak = self.peak
        head = (f"memory plan: peak {peak.gib:.1f} GiB per device in '{peak.name}' on {self.device.name} "
                f"({self.device.memory_gib:.0f} GiB), {self.world_size} device{'s' if self.world_size != 1 else ''}")
        if self.fits:
            line = f"{head}: fits ({self.device.memory_gib - peak.gib:.1f} GiB spare)"
        else:
            line = f"{head}: DOES NOT FIT" + (f"; would fit with {' '.join(self.fixes)}" if self.fixes else
                                              "; no one or two keys make it fit: more devices or a smaller batch")
        host = self.host_per_node_bytes / GIB
        return line + (f"; host {host:.0f} GiB per node" + ("" if self.host_fits else
                       f" (OVER the node's {self.device.host_memory_gib:.0f} GiB)"))

    def counter_note(self) -> str:
        """What ``perf/max_memory_allocated_gb`` should read, where it differs from the device peak ("" elsewhere)."""
        if not self.counted_asleep_bytes:
            return ""
        return (f"allocated counter: perf/max_memory_allocated_gb should read ~{self.allocated_counter_gib:.1f} GiB "
                f"(torch keeps counting the sleeping vLLM's {self.counted_asleep_bytes / GIB:.1f} GiB of weights and "
                "KV cache, unmapped from the device)")

    def table(self) -> str:
        rows = [*self.model_lines, f"{'phase':34s} {'GiB':>8s}  biggest parts"]
        for phase in self.phases:
            parts = sorted(phase.parts.items(), key=lambda kv: -kv[1])[:4]
            rows.append(f"{phase.name:34s} {phase.gib:8.1f}  "
                        + ", ".join(f"{k} {v / GIB:.1f}" for k, v in parts if v > 0))
        rows.append(f"{'host memory per node':34s} {self.host_per_node_bytes / GIB:8.1f}  "
                    + ", ".join(f"{k} {v / GIB:.1f}" for k, v in self.host_parts.items() if v > 0))
        return "\n".join(rows)


@dataclass
class JobInputs:
    """Everything the arithmetic needs, read once from a config (replaced field by field by the fixes)."""

    actor_shape: ModelShape
    actor: TrainSettings
    ref: TrainSettings | None
    critic_shape: ModelShape | None
    critic: TrainSettings | None
    rollout: RolloutSettings
    world_size: int
    devices_per_node: int
    ref_in_actor: bool = False
    work: StepWork | None = None  # what one step computes (the time estimate's input)
    images: ImageLoad | None = None  # a Qwen-VL actor's images as assumed (printed with the plan)


def _fixed_kv_cache_bytes(device: DeviceSpec) -> float | None:
    if device.fixed_kv_cache_gib is None:
        return None
    import os

    value = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "").strip()
    try:
        return float(value) * GIB if value else device.fixed_kv_cache_gib * GIB
    except ValueError:
        return device.fixed_kv_cache_gib * GIB


def plan_inputs(inputs: JobInputs, device: DeviceSpec) -> JobPlan:
    device_bytes = device.memory_gib * GIB
    actor = RoleMemory(inputs.actor_shape, inputs.actor, trainable=True)
    ref = RoleMemory(inputs.actor_shape, inputs.ref, trainable=False) if inputs.ref else None
    critic = RoleMemory(inputs.critic_shape, inputs.critic, trainable=True) if inputs.critic else None
    others = {"reference": ref.resident() if ref else 0.0, "critic": critic.resident() if critic else 0.0}
    engine_device, engine_host = rollout_asleep(inputs.actor_shape, inputs.rollout)
    awake = rollout_awake(inputs.actor_shape, inputs.rollout, device_bytes, inputs.actor.shard > 1,
                          _fixed_kv_cache_bytes(device))
    if engine_device < 0:  # free_cache_engine=False: the engine keeps its share while training runs
        engine_device = sum(awake.values())
    asleep = {"rollout engine (asleep)": engine_device}
    phases = [Phase("rollout", 0.0, {"actor": actor.resident(), **others, **awake})]
    phases.append(Phase("actor log-probs", 0.0, {"actor": actor.resident(), **others, **asleep,
                                                 "forward": actor.forward_peak()}))
    if ref is not None:
        phases.append(Phase("reference log-probs", 0.0, {"actor": actor.resident(), **others, **asleep,
                                                         "forward": ref.forward_peak()}))
    if critic is not None:
        phases.append(Phase("critic values", 0.0, {"actor": actor.resident(), **others, **asleep,
                                                   "forward": critic.forward_peak()}))
        moment, parts = _worst(critic.update_moments())
        phases.append(Phase(f"critic update ({moment})", 0.0, {"actor": actor.resident(), "reference":
                                                               others["reference"], **asleep, **parts}))
    moment, parts = _worst(actor.update_moments())
    phases.append(Phase(f"actor update ({moment})", 0.0, {**others, **asleep, **parts}))
    for phase in phases:
        phase.bytes = sum(phase.parts.values())
    per_rank = {"processes": PROCESS_HOST_GIB * GIB, "offloaded actor": actor.host(),
                "offloaded reference": ref.host() if ref else 0.0,
                "offloaded critic": critic.host() if critic else 0.0, "sleeping engine weights": engine_host}
    ranks = min(inputs.devices_per_node, inputs.world_size)
    host_parts = {k: v * ranks for k, v in per_rank.items()}
    counted = rollout_counted_asleep(inputs.actor_shape, inputs.rollout, awake)
    return JobPlan(device, inputs.world_size, inputs.devices_per_node, phases, sum(host_parts.values()), host_parts,
                   counted_asleep_bytes=counted)


def _worst(moments: dict[str, dict[str, float]]) -> tuple[str, dict[str, float]]:
    return max(moments.items(), key=lambda kv: sum(kv[1].values()))


# ---------------------------------------------------------------------------------------------- the fixes
def _set(role: str, **changes) -> Callable[[JobInputs], JobInputs | None]:
    def apply(inputs: JobInputs) -> JobInputs | None:
        settings = getattr(inputs, role)
        if settings is None or all(getattr(settings, k) == v for k, v in changes.items()):
            return None  # nothing would change
        return replace(inputs, **{role: replace(settings, **changes)})
    return apply


def _halve_micro(inputs: JobInputs) -> JobInputs | None:
    a = inputs.actor
    if a.micro_tokens <= 1:
        return None
    return replace(inputs, actor=replace(a, micro_tokens=a.micro_tokens // 2, micro_response_tokens=
                                         a.micro_response_tokens // 2, micro_batches_per_step=2 *
                                         a.micro_batches_per_step))


def _rollout(**changes) -> Callable[[JobInputs], JobInputs | None]:
    def apply(inputs: JobInputs) -> JobInputs | None:
        if all(getattr(inputs.rollout, k) == v for k, v in changes.items()):
            return None
        return replace(inputs, rollout=replace(inputs.rollout, **changes))
    return apply


FIXES: list[tuple[str, Callable[[JobInputs], JobInputs | None]]] = [
    ("actor_rollout_ref.model.enable_gradient_checkpointing=True", _set("actor", gradient_checkpointing=True)),
    ("actor_rollout_ref.model.use_fused_kernels=True", _set("actor", fused_kernels=True)),
    ("actor_rollout_ref.actor.fsdp_config.optimizer_offload=True", _set("actor", optimizer_offload=True)),
    ("actor_rollout_ref.actor.fsdp_config.param_offload=True", _set("actor", param_offload=True)),
    ("actor_rollout_ref.rollout.free_cache_engine=True", _rollout(free_cache_engine=True)),
    ("actor_rollout_ref.rollout.gpu_memory_utilization=0.4", _rollout(gpu_memory_utilization=0.4)),
    ("(halve actor.ppo_micro_batch_size_per_gpu or ppo_max_token_len_per_gpu)", _halve_micro),
    ("actor_rollout_ref.ref.fsdp_config.param_offload=True", _set("ref", param_offload=True)),
]


def find_fixes(inputs: JobInputs, device: DeviceSpec) -> list[str]:
    """The first single key, else the first pair, of :data:`FIXES` that makes the plan fit."""
    singles = []
    for key, fix in FIXES:
        changed = fix(inputs)
        if changed is not None:
            singles.append((key, fix, changed))
            if plan_inputs(changed, device).fits:
                return [key]
    for i, (key, _, changed) in enumerate(singles):
        for other, fix, _ in singles[i + 1:]:
            both = fix(changed)
            if both is not None and plan_inputs(both, device).fits:
                return [key, other]
    return []


def plan(inputs: JobInputs, device: DeviceSpec) -> JobPlan:
    result = plan_inputs(inputs, device)
    if not result.fits:
        result.fixes = find_fixes(inputs, device)
    result.model_lines = model_summary(inputs.actor_shape, inputs.actor) + vision_summary(inputs)
    result.time = plan_time(inputs, device, result)
    return result


def plan_time(inputs: JobInputs, device: DeviceSpec, memory: JobPlan) -> StepTime | None:
    """The step's seconds per phase on ``device`` (npu_rl/plan/timing.py), with the KV cache the memory plan gives vLLM;
    None for a device kind with no time model (cpu, a hand-made DeviceSpec) or inputs without a StepWork."""
    kind = next((key for key, spec in DEVICES.items() if spec is device), None)
    if kind is None or inputs.work is None:
        return None
    rollout = next(p for p in memory.phases if p.name == "rollout")
    return step_time(actor_shape=inputs.actor_shape, actor=inputs.actor, ref=inputs.ref,
                     ref_in_actor=inputs.ref_in_actor, use_ref=inputs.ref is not None or inputs.ref_in_actor,
                     critic_shape=inputs.critic_shape, critic=inputs.critic, rollout=inputs.rollout,
                     world=inputs.world_size, devices_per_node=inputs.devices_per_node, work=inputs.work,
                     device=kind, device_name=device.name, kv_cache_bytes=rollout.parts.get("KV cache", 0.0))


def model_summary(shape: ModelShape, s: TrainSettings) -> list[str]:
    """A mixture of experts' parameters (total and active per token), routed experts, their shards under expert
    parallelism, and the all-to-all buffers and routed activations of one micro-batch (nothing for a dense model)."""
    if not shape.is_moe:
        return []  # a dense model's plan is its phases
    billions = 1e9
    lines = [f"model: {shape.name or 'decoder'}, {shape.num_params / billions:.2f}B parameters, "
             f"{shape.num_active_params / billions:.2f}B active per token"]
    lines[0] += (f" ({shape.experts_per_token} of {shape.num_experts} routed experts"
                 + (f" + shared experts of {shape.shared_expert_intermediate_size}" if
                    shape.shared_expert_intermediate_size else "")
                 + f" in {shape.num_moe_layers} MoE layers, {shape.num_dense_layers} dense"
                 + (", MLA" if shape.mla else "") + ")")
    mb = dtype_bytes(s.model_dtype)
    ep = max(s.ep, 1)
    expert_bytes = shape.num_expert_params * mb / max(s.shard, 1)
    where = "in host memory with param_offload" if s.param_offload else "on the device"
    lines.append(f"experts: {shape.num_expert_params / billions:.2f}B routed-expert parameters; ep={ep}: "
                 f"{shape.num_experts // ep} experts per layer on each rank, FSDP2 over {max(s.shard // ep, 1)} "
                 f"rank(s) for them: {expert_bytes / GIB:.1f} GiB of expert weights per rank ({s.model_dtype}, "
                 f"{where})")
    tokens = s.micro_tokens / max(s.sp, 1)
    routed = tokens * shape.moe_activation_bytes_per_token()
    a2a = tokens * shape.all_to_all_bytes_per_token(ep)
    lines.append(f"routed activations: {routed / GIB:.2f} GiB per MoE layer per micro-batch of {int(tokens)} tokens "
                 f"(x {shape.experts_per_token} routed copies); all-to-all buffers: "
                 + (f"{a2a / GIB:.2f} GiB per MoE layer (dispatch send + receive, bf16)" if ep > 1 else
                    "none (ep=1)"))
    return lines


def vision_summary(inputs: JobInputs) -> list[str]:
    """A Qwen-VL actor's tower and what the plan assumed of its images (nothing for a text model)."""
    shape, s, images = inputs.actor_shape, inputs.actor, inputs.images
    vision = shape.vision
    if vision is None or images is None:
        return []
    state = ("frozen (LoRA on the language model)" if s.lora_rank else
             "frozen (actor.freeze_vision_tower)" if s.freeze_vision else "trained")
    full = (f", {vision.num_full_attention_blocks} with full attention, the others windows of {vision.window_size} "
            "pixels" if vision.window_size else "")
    lines = [f"vision tower: {vision.family}, {vision.num_params / 1e9:.2f}B parameters ({vision.depth} blocks of "
             f"{vision.hidden_size}{full}), {state}; language model {shape.language_params / 1e9:.2f}B"]
    distinct = "each micro-batch's forward encodes its distinct prompts' images"
    if images.encode_once:
        how = ("each prompt's images encoded once per pass (log-probs, reference, "
               + ("the update, " if state != "trained" else "") + "the hf rollout; transformers >= 5.19)")
        if state == "trained":
            how += f"; in the update {distinct}" if images.dedup else "; in the update every row encodes its own"
    elif images.dedup:
        how = f"{distinct} in every pass (transformers < 5.19; one per micro-batch of up to n = rollout.n rows)"
    else:
        how = "every row encodes its own images in every pass (per-row: transformers < 5.19 without the dedup)"
    lines.append(f"images: {images.images_per_prompt} a prompt x {images.patches_per_image} patches "
                 f"({vision.image_tokens(images.patches_per_image)} image tokens), from {images.source}; {how}")
    role = RoleMemory(shape, s, trainable=True)
    saved, _ = role.vision_update()
    if saved:
        lines.append(f"vision activations: {saved / GIB:.2f} GiB per training micro-batch ({s.update_vision_patches} "
                     f"patches, gradient checkpointing {'on' if s.gradient_checkpointing else 'off'})")
    return lines


# ---------------------------------------------------------------------------------------------- from a config
def _tokens(rows: int | None, dynamic: bool, max_tokens: int, sp: int, seq: int, response: int,
            rows_default: int) -> tuple[int, int]:
    """(tokens, response tokens) of one micro-batch of an sp group."""
    if dynamic:
        tokens = max_tokens * sp
        return tokens, tokens * response // seq
    rows = rows or rows_default
    return rows * seq, rows * response


def inputs_from_config(config, *, model_config: str | None = None, critic_model_config: str | None = None,
                       devices_per_node: int | None = None, ep: int | None = None,
                       mean_prompt_length: int | None = None, mean_response_length: int | None = None,
                       images_per_prompt: int | None = None, image_size: str | tuple[int, int] | None = None,
                       vision_encode: str | None = None) -> JobInputs:
    """The arithmetic's inputs from a validated :class:`~npu_rl.config.schema.PPOConfig`; ``ep``: the expert-parallel
    size of a mixture-of-experts actor (``npu-rl plan --ep``; default: the actor's
    ``fsdp_config.expert_parallel_size``); ``mean_prompt_length`` / ``mean_response_length``: the lengths the time
    estimate assumes (default: the maxima, ``data.max_prompt_length`` / ``max_response_length``). A Qwen-VL actor:
    ``images_per_prompt`` / ``image_size`` (``--images-per-prompt``, ``--image-size 448`` or ``640x480``; default
    :func:`npu_rl.plan.vision.image_load`'s) and ``vision_encode`` (``once`` | ``per-micro-batch`` | ``per-row``;
    default: what this machine's transformers and ``NPU_RL_VISION_DEDUP`` do)."""
    # the memory plan reads no bypass-loss settings: None for them
    run = derive_run_settings(config, estimator_needs(config.algorithm.adv_estimator), None)
    arr, data = config.actor_rollout_ref, config.data
    model, actor_cfg, rollout_cfg, ref_cfg = arr.model, arr.actor, arr.rollout, arr.ref
    world = run.world_size
    sp = max(actor_cfg.ulysses_sequence_parallel_size, 1)
    seq, response = data.max_prompt_length + data.max_response_length, data.max_response_length
    rows_per_mini = run.actor.rows_per_mini_batch
    micro, micro_resp = _tokens(run.micro_batches.actor_update, actor_cfg.use_dynamic_bsz,
                                actor_cfg.ppo_max_token_len_per_gpu, sp, seq, response, rows_per_mini)
    fwd, fwd_resp = _tokens(run.micro_batches.actor_logprob, rollout_cfg.log_prob_use_dynamic_bsz,
                            rollout_cfg.log_prob_max_token_len_per_gpu, sp, seq, response, rows_per_mini)
    fsdp = actor_cfg.fsdp_config
    shard = world if world > 1 and fsdp.fsdp_size in (-1, 0) else (fsdp.fsdp_size if world > 1 else 1)
    lora = int(model.lora_rank or 0)
    actor = TrainSettings(
        model_dtype=fsdp.model_dtype, param_dtype=fsdp.mixed_precision.param_dtype,
        reduce_dtype=fsdp.mixed_precision.reduce_dtype, shard=shard, sp=sp,
        param_offload=bool(fsdp.param_offload or fsdp.offload_policy), optimizer_offload=bool(fsdp.optimizer_offload),
        gradient_checkpointing=bool(model.enable_gradient_checkpointing), micro_tokens=micro,
        micro_response_tokens=micro_resp, forward_tokens=fwd, forward_response_tokens=fwd_resp,
        micro_batches_per_step=max(1, math.ceil(rows_per_mini * seq / max(micro, 1))),
        fused_kernels=bool(model.use_fused_kernels), entropy=actor_cfg.entropy_coeff != 0, lora_rank=lora)
    shape = model_shape(model.path, model_config)
    ep = fsdp.expert_parallel_size if ep is None else ep
    check_ep(shape, ep, shard)
    actor = replace(actor, ep=ep)
    ref = None
    if run.use_ref and not run.ref_in_actor:
        rfsdp = ref_cfg.fsdp_config
        ref_fwd = _tokens(run.micro_batches.ref_logprob, ref_cfg.log_prob_use_dynamic_bsz,
                          ref_cfg.log_prob_max_token_len_per_gpu, sp, seq, response, rows_per_mini)
        ref = replace(actor, model_dtype=rfsdp.model_dtype, param_dtype=rfsdp.mixed_precision.param_dtype,
                      param_offload=bool(rfsdp.param_offload), optimizer_offload=False, lora_rank=0,
                      forward_tokens=ref_fwd[0], forward_response_tokens=ref_fwd[1])
    critic_shape = critic = None
    if run.use_critic:
        c = config.critic
        csp = max(c.ulysses_sequence_parallel_size, 1)
        cfsdp = c.model.fsdp_config
        cmicro = _tokens(run.micro_batches.critic_update, c.use_dynamic_bsz, c.ppo_max_token_len_per_gpu, csp, seq,
                         response, run.critic.rows_per_mini_batch if run.critic else rows_per_mini)
        critic_shape = replace(model_shape(c.model.path, critic_model_config, "critic.model.path"), tied=True)
        critic = TrainSettings(
            model_dtype=cfsdp.model_dtype, param_dtype=cfsdp.mixed_precision.param_dtype, shard=shard, sp=csp,
            param_offload=bool(cfsdp.param_offload), optimizer_offload=bool(cfsdp.optimizer_offload),
            gradient_checkpointing=bool(c.model.enable_gradient_checkpointing), micro_tokens=cmicro[0],
            micro_response_tokens=0, forward_tokens=cmicro[0], forward_response_tokens=0)
    dp = max(world // sp, 1)
    rollout = RolloutSettings(
        engine=rollout_cfg.name, tensor_parallel=rollout_cfg.tensor_model_parallel_size if rollout_cfg.name ==
        "vllm" else 1, gpu_memory_utilization=rollout_cfg.gpu_memory_utilization,
        free_cache_engine=bool(rollout_cfg.free_cache_engine), sleep_level=int(rollout_cfg.sleep_level),
        rows=run.train_rows // dp, sequence_length=seq)
    per_node = devices_per_node or config.trainer.n_gpus_per_node
    images = None
    if shape.vision is not None:
        images = job_images(config, shape.vision, model_config, images_per_prompt, image_size, vision_encode)
        order = RowOrder(update=not (actor_cfg.shuffle or actor_cfg.use_dynamic_bsz),
                         logprobs=not rollout_cfg.log_prob_use_dynamic_bsz, ref=not ref_cfg.log_prob_use_dynamic_bsz)
        actor, ref, rollout = vision_settings(images, actor, ref, rollout, rows=run.train_rows // dp,
                                              n=arr.rollout.n, seq=seq, freeze=bool(actor_cfg.freeze_vision_tower),
                                              order=order)
    work = replace(step_work(config, mean_prompt_length, mean_response_length), images=images)
    return JobInputs(shape, actor, ref, critic_shape, critic, rollout, world, per_node, run.ref_in_actor, work,
                     images)


def _processor_config(model_path: str, model_config: str | None) -> dict | None:
    """The model's preprocessor_config.json (beside ``--model-config``'s file, or in the model folder), if any."""
    folder = None
    if model_config:
        config_file = os.path.expanduser(model_config)
        folder = config_file if os.path.isdir(config_file) else os.path.dirname(config_file)
    elif not is_builtin(model_path):
        folder = local_model_folder(model_path)
    file = os.path.join(folder, "preprocessor_config.json") if folder else None
    if not file or not os.path.isfile(file):
        return None
    try:
        with open(file, encoding="utf-8") as f:
            found = json.load(f)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{file} is not readable JSON ({type(exc).__name__}: {str(exc)[:200]})") from None
    return found if isinstance(found, dict) else None


def job_images(config, vision: VisionShape, model_config: str | None, images_per_prompt: int | None,
               image_size: str | tuple[int, int] | None, vision_encode: str | None) -> ImageLoad:
    """A Qwen-VL job's images per prompt and patches per image (npu_rl/plan/vision.py ``image_load``)."""
    if vision_encode not in (None, *VISION_ENCODE_MODES):
        raise ValueError(f"--vision-encode {vision_encode!r}: expected {' | '.join(VISION_ENCODE_MODES)}")
    if vision_encode is None:  # what this machine's transformers and NPU_RL_VISION_DEDUP would do
        encode_once, dedup = transformers_encodes_once(), vision_dedup_enabled()
    else:
        encode_once, dedup = vision_encode == "once", vision_encode != "per-row"
    data = config.data
    bounds = pixel_bounds(_processor_config(config.actor_rollout_ref.model.path, model_config),
                          dict(data.mm_processor_kwargs or {}))
    size = parse_image_size(image_size) if isinstance(image_size, str) else image_size
    return image_load(vision, images_per_prompt=images_per_prompt, image_size=size, train_files=data.train_files,
                      max_prompt_length=data.max_prompt_length, bounds=bounds, encode_once=encode_once, dedup=dedup)


class RowOrder(NamedTuple):
    """Whether a pass's micro-batches keep a prompt's samples side by side (not shuffled, not regrouped by a token
    budget): the update's, the actor's log-prob pass's, the reference's."""

    update: bool = True
    logprobs: bool = True
    ref: bool = True


def vision_settings(images: ImageLoad, actor: TrainSettings, ref: TrainSettings | None, rollout: RolloutSettings, *,
                    rows: int, n: int, seq: int, freeze: bool, order: RowOrder = RowOrder()
                    ) -> tuple[TrainSettings, TrainSettings | None, RolloutSettings]:
    """The patches each pass runs through the vision tower on one device (docs/vl.md, "one vision forward per
    prompt"): encoded once, a pass's one call covers this rank's distinct prompts and their features are held;
    handed pixels, each micro-batch's forward encodes its distinct prompts' images
    (:func:`~npu_rl.plan.vision.prompts_in_micro_batch`) with the tower's dedup, every row's without it (``per-row``).
    So the tower's activations, working set and FLOPs scale with the images it computes; the share of a pass's rows
    it computes (``vision_*_share``) goes to the time estimate. A trained tower is handed pixels in the update."""
    per_prompt = images.patches_per_prompt
    prompts = math.ceil(rows / max(n, 1))
    frozen = freeze or actor.lora_rank > 0

    def encoded(micro_rows: int, grouped: bool) -> int:
        return prompts_in_micro_batch(micro_rows, n, grouped) if images.dedup else micro_rows

    def forward(s: TrainSettings, grouped: bool) -> TrainSettings:
        if images.encode_once:
            return replace(s, forward_vision_patches=prompts * per_prompt, forward_feature_patches=prompts * per_prompt,
                           vision_forward_share=prompts / max(rows, 1))
        micro_rows = max(s.forward_tokens // seq, 1)
        return replace(s, forward_vision_patches=encoded(micro_rows, grouped) * per_prompt,
                       vision_forward_share=encoded(micro_rows, grouped) / micro_rows)

    micro_rows = max(actor.micro_tokens // seq, 1)
    if frozen and images.encode_once:
        update = dict(update_vision_patches=prompts * per_prompt, update_feature_patches=prompts * per_prompt,
                      vision_update_share=prompts / max(rows, 1))
    else:
        update = dict(update_vision_patches=encoded(micro_rows, order.update) * per_prompt,
                      vision_update_share=encoded(micro_rows, order.update) / micro_rows)
    actor = replace(forward(actor, order.logprobs), freeze_vision=freeze, **update)
    ref = forward(replace(ref, freeze_vision=False), order.ref) if ref is not None else None
    # hf generate: encoded once where the module takes features and has no FSDP hooks (npu_rl/rollout/hf.py), else
    # the pixels repeated per sample, whose one prefill call the dedup cuts to the distinct prompts
    once = (images.encode_once and actor.shard == 1) or images.dedup
    in_master = freeze and actor.shard == 1 and not actor.lora_rank  # a frozen tower shared with the master
    rollout = replace(rollout, vision_patches=(prompts if once else rows) * per_prompt,
                      feature_patches=rows * per_prompt,
                      vision_dtype_bytes=dtype_bytes(actor.model_dtype if in_master else actor.param_dtype))
    return actor, ref, rollout


def step_work(config, mean_prompt_length: int | None = None, mean_response_length: int | None = None) -> StepWork:
    """What one step computes, for the time estimate: prompts generated (DAPO: one ``gen_batch_size`` batch) and
    trained, samples, lengths (the maxima unless given), padding, epochs."""
    data, arr = config.data, config.actor_rollout_ref
    lengths = {"--mean-prompt-length": (mean_prompt_length, data.max_prompt_length),
               "--mean-response-length": (mean_response_length, data.max_response_length)}
    for flag, (mean, maximum) in lengths.items():
        if mean is not None and not 0 < mean <= maximum:
            raise ValueError(f"{flag} {mean}: expected 1 .. {maximum} (the config's maximum)")
    prompts = data.gen_batch_size or data.train_batch_size  # the loader's batch (npu_rl/data/loader.py)
    trained = data.train_batch_size if config.algorithm.filter_groups.enable else prompts
    return StepWork(prompts=prompts, train_prompts=trained, n=arr.rollout.n,
                    prompt_length=mean_prompt_length or data.max_prompt_length,
                    response_length=mean_response_length or data.max_response_length,
                    max_response_length=data.max_response_length, packed=bool(arr.model.use_remove_padding),
                    ppo_epochs=arr.actor.ppo_epochs, critic_epochs=config.critic.ppo_epochs,
                    enforce_eager=bool(arr.rollout.enforce_eager))


def check_ep(shape: ModelShape, ep: int, shard: int) -> None:
    """An expert-parallel size must divide the routed experts and the ranks that shard the model."""
    if ep < 1:
        raise ValueError(f"--ep {ep}: the expert-parallel size is >= 1")
    if ep == 1:
        return
    if not shape.is_moe:
        raise ValueError(f"--ep {ep}: {shape.name or 'the model'} has no routed experts (a dense model); use --ep 1")
    if shape.num_experts % ep:
        raise ValueError(f"--ep {ep} does not divide the model's {shape.num_experts} routed experts")
    if shard % ep:
        raise ValueError(f"--ep {ep} does not divide the {shard} ranks that shard the actor "
                         "(trainer.nnodes x n_gpus_per_node, or fsdp_config.fsdp_size)")


def this_device() -> str:
    """The planner's name for the device this machine would use (the device layer's answer)."""
    backend = get_backend()
    if not backend.is_accelerator:
        return "cpu"
    name = backend.device_name().lower()  # "Ascend910B3", "Ascend910_9392", "NVIDIA H200" ...
    if "ascend" in name or "910" in name:
        return "atlas-a3" if "910c" in name or "910_93" in name else "atlas-a2"
    return "h200" if "h200" in name else "h100"


def plan_config(config, device: str, **kwargs) -> JobPlan:
    """``npu-rl plan``'s answer for a validated config on the named device."""
    spec = device_spec(device)
    return plan(inputs_from_config(config, **kwargs), spec)
