"""GRPO steps of a Qwen3-30B-A3B-shape model cut to a few layers (random bf16 weights, the char tokenizer, so the
vocabulary is tiny and the MoE layers are what costs), hf rollouts recording the experts, R3 replay and the model's
auxiliary loss, on one accelerator; then ``npu-rl plan`` for the same config. Prints both; writes metrics.jsonl and
the plan to OUT.

    python3 scripts/gpu/moe_grpo_step.py --layers 4 --out $OUT
    python3 scripts/gpu/moe_grpo_step.py --layers 4 --engine vllm --out $OUT   # vLLM with its MoE kernels
                                                                               # (KEEP_MOE=1 carry_vllm.sh)
    python3 scripts/gpu/moe_grpo_step.py --layers 4 --engine vllm --gpus 2 --tp 2 --rollout-ep 2 --out $OUT
                                                   # vLLM's expert parallelism (2 GPUs, Ray carried; never run)

With ``--engine vllm`` the rollout is vLLM's (weights synced into its fused experts every step, the experts recorded
by vLLM's capture for R3) and ``--lr`` large enough that a sync that missed the experts would show in
``training/rollout_probs_diff_*``.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from npu_rl.commands.plan import main as plan_main
from npu_rl.models.synthetic import char_tokenizer
from npu_rl.trainer.main_ppo import main as train_main
from step_common import fresh_work_folder, print_step_figures  # scripts/gpu/step_common.py (this folder)

QWEN3_30B_A3B = dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                     num_experts_per_tok=8, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                     norm_topk_prob=True, max_position_embeddings=4096, rope_theta=1e6, tie_word_embeddings=False)


TINY = dict(QWEN3_30B_A3B, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
            num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # a CPU smoke test


def save_model(path: str, layers: int, shape: dict) -> str:
    tokenizer = char_tokenizer()
    config = AutoConfig.for_model("qwen3_moe", num_hidden_layers=layers, vocab_size=len(tokenizer),
                                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                  pad_token_id=tokenizer.pad_token_id, **shape)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default="/tmp/out")
    parser.add_argument("--work", default="/tmp/moe_step")
    parser.add_argument("--tiny", action="store_true", help="a tiny MoE and short lengths (a CPU smoke test)")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--replay", choices=("R3", "disabled"), default="R3")
    parser.add_argument("--gpus", type=int, default=1, help="trainer.n_gpus_per_node (> 1 runs Ray workers)")
    parser.add_argument("--tp", type=int, default=1, help="rollout.tensor_model_parallel_size")
    parser.add_argument("--rollout-ep", type=int, default=1, help="rollout.expert_parallel_size (vLLM's "
                        "enable_expert_parallel; 1 or --tp)")
    parser.add_argument("--tag", default="", help="added to the metrics file's name (runs that share --out)")
    parser.add_argument("overrides", nargs="*", help="more key=value overrides, last (e.g. "
                        "actor_rollout_ref.actor.use_torch_compile=True)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    fresh_work_folder(args.work)  # emptied only if these scripts made it
    model_dir = save_model(os.path.join(args.work, "model"), args.layers, TINY if args.tiny else QWEN3_30B_A3B)
    overrides = [
        "data.train_files=builtin://arith/train", "data.val_files=builtin://arith/test", "data.train_batch_size=32",
        "data.max_prompt_length=128", "data.max_response_length=256", "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model_dir}", f"actor_rollout_ref.rollout.name={args.engine}",
        "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.ignore_eos=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=64", f"actor_rollout_ref.actor.optim.lr={args.lr}",
        f"actor_rollout_ref.rollout.enable_rollout_routing_replay={args.replay == 'R3'}",
        f"actor_rollout_ref.actor.router_replay.mode={args.replay}",
        "+actor_rollout_ref.model.override_config.output_router_logits=True",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={args.tp}",
        f"actor_rollout_ref.rollout.expert_parallel_size={args.rollout_ep}", f"trainer.n_gpus_per_node={args.gpus}",
        "trainer.logger=[console]",
        f"trainer.default_local_dir={args.work}/run",
        f"trainer.total_training_steps={args.steps}", "trainer.save_freq=-1", "trainer.test_freq=-1",
        "trainer.val_before_train=False", "trainer.resume_mode=disable", "preset=grpo",
    ]
    if args.engine == "vllm":
        overrides += ["actor_rollout_ref.rollout.calculate_log_probs=True",
                      "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"]
    if args.tiny:
        overrides += ["data.train_batch_size=4", "data.max_response_length=16", "actor_rollout_ref.rollout.n=2",
                      "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                      "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32"]
    overrides += list(args.overrides)
    code = train_main(overrides, default_config="ppo_trainer")
    for path in glob.glob(os.path.join(args.work, "run", "logs", "*", "metrics.jsonl")):
        shutil.copy(path, os.path.join(args.out, f"moe_metrics_{args.engine}_{args.replay}{args.tag}.jsonl"))
        print_step_figures(path)
    print(f"== train exit {code}", flush=True)
    sys.stdout.flush()
    plan_code = plan_main(["--config-name", "ppo_trainer"] + overrides +
                          ["--model-config", os.path.join(model_dir, "config.json")])
    print(f"== plan exit {plan_code}", flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
