"""The time model (:mod:`npu_rl.plan.timing`) against every H200 row of docs/benchmarks.md whose sizes are known: each
row's config, the seconds measured per phase, and what the planner predicts for it. ``python -m
npu_rl.plan.calibration`` prints the table of docs/benchmarks.md ("Planner time predictions vs measured");
tests/plan/test_timing.py checks that the docs hold exactly this table, so the docs cannot drift from the code.

Phases compared: ``gen`` (the trainer's ``timing_s/gen``: wake, weight sync, generation and sleep; the rollout-only
rows: generation alone), ``old`` / ``ref`` (log-prob forwards), ``update``, ``step`` (the sum). A measured range
(``lo``, ``hi``) is compared at its middle. The constants were read from the rows marked "fit" (their phases named);
the others are checks. :func:`memory_table` puts the memory plan's peak beside the rows that report one.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from dataclasses import dataclass, field, replace

from npu_rl.config.loader import load_config
from npu_rl.models.synthetic import SHAPES
from npu_rl.plan.job import inputs_from_config, plan
from npu_rl.plan.memory import GIB, ModelShape, RoleMemory, TrainSettings, device_spec
from npu_rl.plan.timing import SPEEDS, train_phase

LIMIT = 0.25  # the goal: time within 25%
MEMORY_LIMIT = 0.15  # and memory within 15%

# Qwen3-30B-A3B's layer shape cut to 4 layers with the char tokenizer (scripts/gpu/moe_grpo_step.py)
MOE_4_LAYERS = dict(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                    num_experts=128, num_experts_per_tok=8, num_attention_heads=32, num_key_value_heads=4,
                    head_dim=128, num_hidden_layers=4, vocab_size=100, tie_word_embeddings=False)
# SmolLM2-135M-Instruct (the embedded model's GGUF: llama, 30 layers, hidden 576, vocab 49,152)
SMOLLM2 = dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True)

# Qwen2.5-VL-7B-Instruct's vision tower and language layers cut to 4 (scripts/gpu/vl_grpo_step.py's model; the
# char tokenizer's vocabulary)
QWEN2_5_VL_7B_4_LAYERS = dict(
    model_type="qwen2_5_vl", tie_word_embeddings=False, image_token_id=102, video_token_id=103,
    vision_start_token_id=100, vision_end_token_id=101,
    text_config=dict(model_type="qwen2_5_vl_text", bos_token_id=None, eos_token_id=2, hidden_size=3584,
                     intermediate_size=18944, num_hidden_layers=4, num_attention_heads=28, num_key_value_heads=4,
                     vocab_size=104, tie_word_embeddings=False, max_position_embeddings=128000,
                     rope_parameters={"mrope_section": [16, 24, 24], "rope_theta": 1000000.0, "rope_type": "default"}),
    vision_config=dict(model_type="qwen2_5_vl_vision", depth=32, hidden_size=1280, intermediate_size=3420,
                       num_heads=16, out_hidden_size=3584, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                       window_size=112, fullatt_block_indexes=[7, 15, 23, 31], in_chans=3))

_BENCH = ["preset=grpo", "data.train_batch_size=16", "data.max_prompt_length=128", "data.max_response_length=256",
          "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.rollout.n=4",
          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
          "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64",
          "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=64",
          "actor_rollout_ref.model.use_fused_kernels=True",
          "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "trainer.n_gpus_per_node=1", "trainer.nnodes=1"]
_HF, _VLLM = ["actor_rollout_ref.rollout.name=hf"], ["actor_rollout_ref.rollout.name=vllm"]
_NOCKPT = ["actor_rollout_ref.model.enable_gradient_checkpointing=False"]
_EAGER = ["actor_rollout_ref.rollout.enforce_eager=True"]
# `npu-rl bench verl`'s padded job (verl's unfused log-probs, 8-row micro-batches, SDPA with left padding), and the
# q05 row's sizes on it (_BENCH's, longer prompts)
_VERL_8_ROW_PADDED = ["actor_rollout_ref.actor.use_kl_loss=False",
                      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                      "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
                      "actor_rollout_ref.model.use_remove_padding=False"]
_BENCH_VERL_PADDED = ([k for k in _BENCH if "micro_batch" not in k and "fused" not in k] + _VLLM
                      + ["data.max_prompt_length=160"] + _VERL_8_ROW_PADDED)
_MOE_STEP = ["preset=grpo", "data.train_batch_size=32", "data.max_prompt_length=128", "data.max_response_length=256",
             "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64",
             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=64",
             "trainer.n_gpus_per_node=1"]  # scripts/gpu/moe_grpo_step.py's batch (the rows' engine added)


@dataclass(frozen=True)
class MeasuredRow:
    label: str
    source: str  # where in docs/benchmarks.md
    model: str | dict  # a SHAPES key or config.json fields
    overrides: list[str]
    measured: dict[str, tuple[float, float]]  # phase -> (lo, hi) seconds
    scope: str = "step"  # step | rollout (generation alone) | update (an update alone, bench_lora)
    fit: str = ""  # the phases the constants were read from
    mean_prompt_length: int | None = None
    mean_response_length: int | None = None
    update_settings: dict = field(default_factory=dict)  # scope "update": TrainSettings fields
    note: str = ""
    peak_gib: float | None = None  # measured peak memory per device (perf/max_memory_allocated_gb), where reported
    grad_cast_copy: bool = True  # measured before 2026-12-03's grads_to_master change (TrainSettings.grad_cast_copy)
    device: str = "h200"  # the card it ran on (a device_spec name); the plan is made for that card
    vision_encode: str | None = None  # a Qwen-VL row: "per-row" where transformers < 5.19 ran it (npu-rl plan's flag)


def _same(*values: float) -> tuple[float, float]:
    return (min(values), max(values))


ROWS = [
    MeasuredRow("0.5B, hf compiled decoding, fused, checkpointing", "Compiled decoding and compiled blocks",
                "qwen2.5-0.5b", _BENCH + _HF,
                {"gen": _same(1.49), "old": _same(0.056), "ref": _same(0.057), "update": _same(0.253),
                 "step": _same(1.86)}, fit="gen, old, update", peak_gib=10.3),
    MeasuredRow("0.5B, same, no checkpointing", "Compiled decoding and compiled blocks", "qwen2.5-0.5b",
                _BENCH + _HF + _NOCKPT, {"gen": _same(1.54), "old": _same(0.057), "ref": _same(0.058),
                                         "update": _same(0.234), "step": _same(1.90)}, fit="update",
                peak_gib=30.9),
    MeasuredRow("1.5B, hf compiled decoding, fused, checkpointing", "Compiled decoding and compiled blocks",
                "qwen2.5-1.5b", _BENCH + _HF, {"gen": _same(2.31), "old": _same(0.142), "ref": _same(0.146),
                                               "update": _same(0.561), "step": _same(3.17)}, fit="old, update",
                peak_gib=31.7),
    MeasuredRow("1.5B, same, no checkpointing", "Compiled decoding and compiled blocks", "qwen2.5-1.5b",
                _BENCH + _HF + _NOCKPT, {"gen": _same(2.15), "old": _same(0.144), "ref": _same(0.147),
                                         "update": _same(0.465), "step": _same(2.91)}, fit="update",
                peak_gib=71.4),
    MeasuredRow("0.5B, hf eager decoding, fused", "Compiled decoding and compiled blocks (eager rows)",
                "qwen2.5-0.5b", _BENCH + _HF + _EAGER,
                {"gen": _same(5.22, 4.86), "old": _same(0.071, 0.077), "ref": _same(0.071, 0.077),
                 "update": _same(0.281, 0.283), "step": _same(5.65, 5.31)}, fit="gen", peak_gib=10.5,
                note="eager blocks (before compiled blocks)"),
    MeasuredRow("0.5B, hf eager decoding, 2 H200s FSDP2, 64 rows", "Two H200s through Ray vs one (run B)",
                "qwen2.5-0.5b", _BENCH + _HF + _EAGER + [
                    "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
                    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
                    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32"],
                {"gen": _same(4.90), "update": _same(0.312), "step": _same(5.37)}, peak_gib=6.0),
    MeasuredRow("0.5B, same, 2 H200s, 128 rows", "Two H200s through Ray vs one (run B)", "qwen2.5-0.5b",
                _BENCH + _HF + _EAGER + ["trainer.n_gpus_per_node=2", "data.train_batch_size=32",
                                         "actor_rollout_ref.actor.ppo_mini_batch_size=32"],
                {"gen": _same(6.48), "update": _same(0.385), "step": _same(7.08)}, peak_gib=7.2),
    MeasuredRow("0.5B, vLLM, sleep level 2", "vLLM on one H200 (sleep level 2 row)", "qwen2.5-0.5b",
                _BENCH + _VLLM + ["actor_rollout_ref.rollout.sleep_level=2"],
                {"gen": _same(1.29), "old": _same(0.068), "ref": _same(0.064), "update": _same(0.271),
                 "step": _same(1.71)}, fit="gen (vLLM at 64 rows)", peak_gib=77.4),
    MeasuredRow("0.5B, vLLM, `bench trl` (no reference)", "issue 36's table (ours, steady step)", "qwen2.5-0.5b",
                [k for k in _BENCH if "micro_batch" not in k and "max_prompt" not in k] + _VLLM + [
                    "data.max_prompt_length=160", "actor_rollout_ref.actor.use_kl_loss=False"],
                {"step": _same(2.05)}, mean_prompt_length=128, note="default micro-batches"),
    MeasuredRow("0.5B rollout alone, vLLM, 64 prompts x 4, log-probs", "vLLM on one H200 (throughput row)",
                "qwen2.5-0.5b", _BENCH + _VLLM + ["data.train_batch_size=64"], {"gen": _same(2.69)},
                scope="rollout", fit="gen (vLLM at 256 rows)"),
    MeasuredRow("0.5B rollout alone, vLLM, 64 prompts x 4 (2026-12-03)", "DESIGN.md's rollout figures",
                "qwen2.5-0.5b", _BENCH + _VLLM + ["data.train_batch_size=64"], {"gen": _same(65536 / 34860)},
                scope="rollout", fit="gen (vLLM at 256 rows)"),
    MeasuredRow("0.5B rollout alone, hf eager, 64 rows (`gen_overhead.py`)", "Where the rollout's time went",
                "qwen2.5-0.5b", _BENCH + _HF + _EAGER + ["actor_rollout_ref.rollout.n=1",
                                                         "data.train_batch_size=64"],
                {"gen": _same(4.49, 5.10)}, scope="rollout"),
    MeasuredRow("0.5B rollout alone, hf compiled, 64 rows (`gen_overhead.py`)", "Where the rollout's time went",
                "qwen2.5-0.5b", _BENCH + _HF + ["actor_rollout_ref.rollout.n=1", "data.train_batch_size=64"],
                {"gen": _same(1.13)}, scope="rollout"),
    MeasuredRow("7B update alone, LoRA r=64 (`bench_lora`)", "LoRA vs full fine-tuning (re-measured)", "qwen2.5-7b",
                [], {"update": _same(0.82)}, scope="update", peak_gib=29.7,
                update_settings=dict(lora_rank=64, micro_tokens=8 * 1024, micro_response_tokens=8 * 768)),
    MeasuredRow("7B update alone, full, bf16 weights and AdamW (`bench_lora`)", "LoRA vs full fine-tuning "
                "(re-measured)", "qwen2.5-7b", [], {"update": _same(0.88)}, scope="update", peak_gib=58.1,
                update_settings=dict(model_dtype="bf16", param_dtype="bf16", micro_tokens=8 * 1024,
                                     micro_response_tokens=8 * 768)),
    MeasuredRow("MoE 4 layers (Qwen3-30B-A3B shape), hf", "GRPO steps of a Qwen3-30B-A3B shape cut to 4 layers",
                MOE_4_LAYERS, _MOE_STEP + _HF,
                {"gen": _same(12.4), "old": _same(0.20), "ref": _same(0.21), "update": _same(1.16, 1.19),
                 "step": _same(14.1)}, mean_prompt_length=54, peak_gib=65.1,
                note="prompts ~54 tokens: the step's tokens/s over 256 x (prompt + 256)"),
    MeasuredRow("MoE 4 layers (Qwen3-30B-A3B shape), hf, compiled experts (2026-12-07)",
                "GRPO steps of a Qwen3-30B-A3B shape cut to 4 layers (compiled, H200)", MOE_4_LAYERS,
                _MOE_STEP + _HF,
                {"gen": _same(2.887, 2.889), "old": _same(0.175, 0.178), "ref": _same(0.169, 0.173),
                 "update": _same(0.714, 0.782), "step": _same(4.02, 4.16)}, mean_prompt_length=55, peak_gib=52.2,
                grad_cast_copy=False, note="steps 2-3; the gradient casts one tensor at a time"),
    MeasuredRow("MoE 4 layers, vLLM (R3)", "The same steps with vLLM rollouts (both runs)", MOE_4_LAYERS,
                _MOE_STEP + ["actor_rollout_ref.rollout.gpu_memory_utilization=0.3"] + _VLLM,
                {"gen": _same(3.2, 4.3), "sync": _same(0.85, 1.36), "old": _same(0.19, 0.20),
                 "ref": _same(0.19, 0.20), "update": _same(0.96, 1.07), "step": _same(4.6, 7.7)}, peak_gib=101.4,
                mean_prompt_length=54, note="gen is generation alone here, sync apart"),
    MeasuredRow("0.5B, vLLM, `bench verl` padded, 8-row micro-batches, plain log-probs",
                "Side by side with verl (ours, attempts 2 and 3)", "qwen2.5-0.5b",
                _BENCH_VERL_PADDED,
                {"old": _same(0.21, 0.23), "update": _same(1.30, 1.42), "step": _same(2.50, 2.89)},
                mean_prompt_length=144, peak_gib=81.4, fit="old (host floor)",
                note="SDPA with left padding; 400 tokens a row from its tokens/s"),
    MeasuredRow("the same on an H100 (2026-12-07)", "Side by side with verl (ours, attempts 2 and 3)", "qwen2.5-0.5b",
                _BENCH_VERL_PADDED,
                {"gen": _same(1.05), "old": _same(0.25), "update": _same(1.37), "step": _same(2.68)},
                mean_prompt_length=147, peak_gib=51.1, device="h100", grad_cast_copy=False,
                note="row q05, steps 2-3"),
    MeasuredRow("0.5B, vLLM, `bench verl` padded, 1k + 1k tokens, H100 (2026-12-07)",
                "Side by side with verl (ours, attempts 2 and 3)", "qwen2.5-0.5b",
                [k for k in _BENCH if "micro_batch" not in k and "fused" not in k and "batch_size" not in k
                 and "rollout.n=" not in k and "_length=" not in k] + _VLLM + [
                    "data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
                    "actor_rollout_ref.rollout.n=8", "data.max_prompt_length=1056", "data.max_response_length=1024"]
                + _VERL_8_ROW_PADDED,
                {"gen": _same(5.96), "old": _same(2.27), "update": _same(7.17), "step": _same(15.46, 15.49)},
                mean_prompt_length=1043, peak_gib=60.0, device="h100", grad_cast_copy=False,
                note="row q05-1k, steps 2-3"),
    MeasuredRow("Qwen2.5-VL-7B shape, 4 layers, hf, 448 x 448 pictures (2026-12-07)",
                "GRPO steps at the Qwen2.5-VL-7B shape cut to 4 layers", QWEN2_5_VL_7B_4_LAYERS,
                ["preset=grpo", "data.train_files='builtin://shapes/train?size=448&num_train=512&num_test=8'",
                 "data.val_files='builtin://shapes/test?size=448&num_train=512&num_test=8'",
                 "data.train_batch_size=32", "data.max_prompt_length=512", "data.max_response_length=256",
                 "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.n=8",
                 "actor_rollout_ref.rollout.ignore_eos=True", "actor_rollout_ref.model.use_remove_padding=True",
                 "actor_rollout_ref.model.enable_gradient_checkpointing=True",
                 "actor_rollout_ref.actor.ppo_mini_batch_size=32",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
                 "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
                 "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
                 "actor_rollout_ref.actor.freeze_vision_tower=False", "trainer.n_gpus_per_node=1"],
                {"gen": _same(3.606, 3.748), "old": _same(2.066, 2.135), "ref": _same(2.005, 2.084),
                 "update": _same(8.325, 8.606), "step": _same(16.32, 16.33)}, mean_prompt_length=334, peak_gib=36.08,
                grad_cast_copy=False, device="h100", vision_encode="per-row",
                note="steps 2-3; tower trained, packed vision attention, pictures encoded per row"),
    MeasuredRow("embedded default (SmolLM2-135M), vLLM, steady step", "vLLM on one H200 (embedded default)",
                SMOLLM2, ["preset=grpo", "actor_rollout_ref.actor.use_kl_loss=False", "data.train_batch_size=4",
                          "actor_rollout_ref.rollout.n=8", "data.max_prompt_length=64", "data.max_response_length=64",
                          "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "trainer.n_gpus_per_node=1"]
                + _VLLM, {"gen": _same(0.42), "old": _same(0.10), "update": _same(0.60), "step": _same(1.13)},
                mean_prompt_length=45, mean_response_length=16,
                note="prompts ~45, responses 20 -> 12 tokens; 4 micro-batches"),
]


PEAK = "peak GiB"  # predict()'s key for the memory plan's peak per device


def _model_config(folder: str, model: str | dict) -> str:
    if isinstance(model, str):
        fields = SHAPES[model]
        model = {"model_type": "qwen2", **{k: fields[k] for k in (
            "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "vocab_size", "tie_word_embeddings")}}
    path = os.path.join(folder, "config.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(model, f)
    return path


def _shape(model: str) -> ModelShape:
    f = SHAPES[model]
    return ModelShape(f["hidden_size"], f["intermediate_size"], f["num_hidden_layers"], f["num_attention_heads"],
                      f["num_key_value_heads"], f["vocab_size"], f["tie_word_embeddings"])


def predict(row: MeasuredRow) -> dict[str, float]:
    """The planner's seconds for the row's phases (on the row's card)."""
    if row.scope == "update":
        phase = train_phase("actor update", _shape(row.model), TrainSettings(**row.update_settings), SPEEDS["h200"],
                            8, tokens=row.update_settings["micro_tokens"],
                            response_tokens=row.update_settings["micro_response_tokens"],
                            context=row.update_settings["micro_tokens"] / 8 / 2, update=True)
        role = RoleMemory(_shape(row.model), TrainSettings(**row.update_settings, grad_cast_copy=True),
                          trainable=True)  # measured with the code before 2026-12-03 (see predict's other branch)
        peak = max(sum(parts.values()) for parts in role.update_moments().values()) / GIB
        return {"update": phase.seconds, PEAK: peak}
    with tempfile.TemporaryDirectory() as folder:
        config_json = _model_config(folder, row.model)
        overrides = row.overrides + [f"actor_rollout_ref.model.path={folder}"]
        inputs = inputs_from_config(load_config(overrides, "ppo_trainer"), model_config=config_json,
                                    mean_prompt_length=row.mean_prompt_length,
                                    mean_response_length=row.mean_response_length, vision_encode=row.vision_encode)
        # plan the code that ran: most rows were measured before 2026-12-03's grads_to_master change
        inputs = replace(inputs, actor=replace(inputs.actor, grad_cast_copy=row.grad_cast_copy))
        result = plan(inputs, device_spec(row.device))
    time = result.time
    generation = time.phase("rollout: prefill") + time.phase("rollout: decode")
    out = {"gen": time.phase("rollout") if "sync" not in row.measured and row.scope == "step" else generation,
           "sync": time.phase("rollout: weight sync"), "old": time.phase("actor log-probs"),
           "ref": time.phase("reference log-probs"), "update": time.phase("actor update"), "step": time.seconds}
    # the measured peaks are torch's allocated counter, which keeps a sleeping vLLM's unmapped tensors
    return {k: v for k, v in out.items() if k in row.measured} | {PEAK: result.allocated_counter_gib}


def _label(row: MeasuredRow) -> str:
    return row.label if row.device == "h200" else f"{row.label} [{row.device.upper()}]"


def error(predicted: float, measured: tuple[float, float]) -> float:
    middle = (measured[0] + measured[1]) / 2
    return predicted / middle - 1


def _seconds(measured: tuple[float, float]) -> str:
    lo, hi = measured
    return f"{lo:.3g}" if lo == hi else f"{lo:.3g}-{hi:.3g}"


@functools.cache
def predictions() -> tuple[dict[str, float], ...]:
    """:func:`predict` of every row of :data:`ROWS` (computed once: each builds a config and a plan)."""
    return tuple(predict(row) for row in ROWS)


def table() -> str:
    """The markdown table of docs/benchmarks.md: one line per row and phase."""
    lines = ["| measured row (one H200 unless named) | phase | measured s | predicted s | error | fit? |",
             "|---|---|---|---|---|---|"]
    for row, predicted in zip(ROWS, predictions()):
        for phase, measured in row.measured.items():
            err = error(predicted[phase], measured)
            flag = " **over 25%**" if abs(err) > LIMIT else ""
            fit = "fit" if phase in row.fit else ""
            label = _label(row) + (f" ({row.note})" if row.note else "")
            lines.append(f"| {label} | {phase} | {_seconds(measured)} | {predicted[phase]:.3g} | "
                         f"{err:+.0%}{flag} | {fit} |")
    return "\n".join(lines)


def outliers() -> list[tuple[str, str, float]]:
    """(row, phase, error) of every comparison outside the 25% goal."""
    out = []
    for row, predicted in zip(ROWS, predictions()):
        for phase, measured in row.measured.items():
            err = error(predicted[phase], measured)
            if abs(err) > LIMIT:
                out.append((row.label, phase, err))
    return out


def memory_table() -> str:
    """The rows that report a peak: the memory plan's peak per device against it (goal: within 15%)."""
    lines = ["| measured row (one H200 unless named) | measured peak GiB | planned peak GiB | error |",
             "|---|---|---|---|"]
    for row, predicted in zip(ROWS, predictions()):
        if row.peak_gib is not None:
            err = predicted[PEAK] / row.peak_gib - 1
            flag = " **over 15%**" if abs(err) > MEMORY_LIMIT else ""
            lines.append(f"| {_label(row)} | {row.peak_gib:.1f} | {predicted[PEAK]:.1f} | {err:+.0%}{flag} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
    print()
    print(memory_table())
