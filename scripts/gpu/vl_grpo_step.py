"""GRPO steps of a Qwen2.5-VL-7B-shape model (its published vision tower and language-model shapes, the language
model cut to ``--layers`` layers; random bf16 weights; the char tokenizer with the vision tokens, so the vocabulary
is tiny and the vision tower and decoder layers are what costs) on the shipped visual task with 448 x 448 pictures
(256 image tokens a prompt), on one accelerator; then ``npu-rl plan`` for the same config (vision tower included:
its weights, optimizer state, activations and FLOPs; this machine's transformers decides whether each prompt's images
are encoded once per pass). Prints both; writes to OUT the metrics, the model's config.json, the overrides and the
plan's own flags (``vl_plan_flags_<engine>.json``), so the plan can be re-run elsewhere:

    npu-rl plan $(python3 -c "import json; print(' '.join(json.load(open('OUT/vl_overrides_hf.json'))
        + json.load(open('OUT/vl_plan_flags_hf.json'))))") --model-config OUT/vl_config_hf.json

    python3 scripts/gpu/vl_grpo_step.py --layers 4 --out $OUT                  # hf rollout
    python3 scripts/gpu/vl_grpo_step.py --layers 4 --engine vllm --out $OUT    # vLLM with images (carry_vllm.sh)
    python3 scripts/gpu/vl_grpo_step.py --tiny --steps 2 --out /tmp/o          # a CPU smoke test
    python3 scripts/gpu/vl_grpo_step.py ... key=value ...                       # more overrides, last

``--lr`` large enough that a weight sync that missed the vision tower would show in
``training/rollout_probs_diff_*`` (vLLM); with the hf engine that metric is the banned vision tokens' mass only.
``--freeze-vision-tower`` trains the language model only (verl's ``actor.freeze_vision_tower``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys

import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from npu_rl.commands.plan import main as plan_main
from npu_rl.models.vision_dedup import vision_dedup_enabled
from npu_rl.plan.vision import transformers_encodes_once
from npu_rl.models.synthetic import tiny_image_processor, vl_char_tokenizer
from npu_rl.trainer.main_ppo import main as train_main
from step_common import fresh_work_folder, print_step_figures  # scripts/gpu/step_common.py (this folder)

# Qwen/Qwen2.5-VL-7B-Instruct's config.json (text and vision shapes)
QWEN2_5_VL_7B_TEXT = dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4,
                          max_position_embeddings=128000, rms_norm_eps=1e-6, tie_word_embeddings=False,
                          rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24],
                                           "rope_theta": 1000000.0})
QWEN2_5_VL_7B_VISION = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                            patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                            fullatt_block_indexes=[7, 15, 23, 31], hidden_act="silu", in_chans=3)
TINY_TEXT = dict(QWEN2_5_VL_7B_TEXT, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                 num_key_value_heads=2, rope_parameters={"rope_type": "default", "mrope_section": [4, 6, 6],
                                                         "rope_theta": 10000.0})
TINY_VISION = dict(QWEN2_5_VL_7B_VISION, depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                   out_hidden_size=128, window_size=56, fullatt_block_indexes=[1])


def save_model(path: str, layers: int, text: dict, vision: dict, image: int) -> str:
    """A Qwen2.5-VL folder: random bf16 weights, the char tokenizer with the vision tokens, an image processor
    bounded to ``image`` x ``image`` pictures."""
    tokenizer = vl_char_tokenizer()
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in [
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")]}
    text = dict(text, num_hidden_layers=layers, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **ids)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2_5_VLForConditionalGeneration(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    tiny_image_processor(min_pixels=28 * 28, max_pixels=image * image, patch_size=14).save_pretrained(path)
    return path


def overrides_for(args, model_dir: str) -> list[str]:
    data = f"builtin://shapes/{{}}?size={args.image}&num_train=512&num_test=8"
    overrides = [
        f"data.train_files='{data.format('train')}'", f"data.val_files='{data.format('test')}'",
        "data.train_batch_size=32", "data.max_prompt_length=512", "data.max_response_length=256",
        "data.dataloader_num_workers=0", f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.rollout.name={args.engine}", "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.rollout.ignore_eos=True", "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32", f"actor_rollout_ref.actor.optim.lr={args.lr}",
        f"actor_rollout_ref.actor.freeze_vision_tower={args.freeze_vision_tower}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "trainer.n_gpus_per_node=1",
        "trainer.logger=[console]", f"trainer.default_local_dir={args.work}/run",
        f"trainer.total_training_steps={args.steps}", "trainer.save_freq=-1", "trainer.test_freq=-1",
        "trainer.val_before_train=False", "trainer.resume_mode=disable", "preset=grpo",
    ]
    if args.engine == "vllm":
        overrides += ["actor_rollout_ref.rollout.calculate_log_probs=True", "actor_rollout_ref.rollout.limit_images=1",
                      "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"]
    if args.tiny:
        overrides += ["data.train_batch_size=2", "data.max_prompt_length=128", "data.max_response_length=8",
                      "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                      "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
                      "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.max_model_len=160",
                      "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=67108864"]
    return overrides


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=4, help="language-model layers (28 in the real 7B)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--image", type=int, default=448, help="picture side in pixels (448: 256 image tokens)")
    parser.add_argument("--out", default="/tmp/out")
    parser.add_argument("--work", default="/tmp/vl_step")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and short lengths (a CPU smoke test)")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--freeze-vision-tower", action="store_true")
    parser.add_argument("overrides", nargs="*", help="more key=value overrides, last (e.g. "
                        "+actor_rollout_ref.rollout.engine_kwargs.vllm.mm_encoder_attn_backend=TORCH_SDPA)")
    args = parser.parse_args()
    if args.tiny and args.image == 448:
        args.image = 56
    os.makedirs(args.out, exist_ok=True)
    fresh_work_folder(args.work)  # emptied only if these scripts made it
    text, vision = (TINY_TEXT, TINY_VISION) if args.tiny else (QWEN2_5_VL_7B_TEXT, QWEN2_5_VL_7B_VISION)
    model_dir = save_model(os.path.join(args.work, "model"), args.layers, text, vision, args.image)
    overrides = overrides_for(args, model_dir) + list(args.overrides)
    # what the plan needs to be re-run elsewhere from what comes back: the model's config.json and the overrides
    shutil.copy(os.path.join(model_dir, "config.json"), os.path.join(args.out, f"vl_config_{args.engine}.json"))
    with open(os.path.join(args.out, f"vl_overrides_{args.engine}.json"), "w") as f:
        json.dump(overrides, f, indent=1)
    code = train_main(overrides, default_config="ppo_trainer")
    prompt_lengths = []
    for path in glob.glob(os.path.join(args.work, "run", "logs", "*", "metrics.jsonl")):
        shutil.copy(path, os.path.join(args.out, f"vl_metrics_{args.engine}.jsonl"))
        print_step_figures(path)
        with open(path) as f:
            prompt_lengths += [row["prompt_length/mean"] for row in map(json.loads, f) if "prompt_length/mean" in row]
    print(f"== train exit {code}", flush=True)
    sys.stdout.flush()
    # the plan for the same config, vision tower included (npu_rl/plan/vision.py): its time estimate at the run's
    # measured mean prompt length (image pads included), the images encoded as this machine's transformers and
    # NPU_RL_VISION_DEDUP do
    measured = ["--mean-prompt-length", str(round(sum(prompt_lengths) / len(prompt_lengths)))] if prompt_lengths else []
    encode = "once" if transformers_encodes_once() else "per-micro-batch" if vision_dedup_enabled() else "per-row"
    flags = [*measured, "--vision-encode", encode]
    with open(os.path.join(args.out, f"vl_plan_flags_{args.engine}.json"), "w") as f:
        json.dump(flags, f)
    plan_code = plan_main(["--config-name", "ppo_trainer"] + overrides +
                          ["--model-config", os.path.join(model_dir, "config.json"), *flags])
    print(f"== plan exit {plan_code}", flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
