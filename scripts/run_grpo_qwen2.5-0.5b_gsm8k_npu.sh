#!/usr/bin/env bash
# GRPO on GSM8K with Qwen2.5-0.5B-Instruct on one Atlas node (8 NPUs), submitted to a running Ray cluster.
#   bash scripts/atlas/start_ray_head.sh           # once, on this node
#   MODEL_PATH=/models/Qwen2.5-0.5B-Instruct bash scripts/run_grpo_qwen2.5-0.5b_gsm8k_npu.sh
# Data: `npu-rl preprocess gsm8k --output-dir $DATA_DIR` (from the local JSONL; nothing is downloaded).
# Not run on NPU hardware in this repository (no NPU here): see docs/npu.md for what was and was not verified.
set -euo pipefail
MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a Qwen2.5-0.5B-Instruct folder}
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
NPUS=${NPUS:-8}
RAY_ADDRESS=${RAY_ADDRESS:-http://127.0.0.1:8265}
[ -f "$DATA_DIR/train.parquet" ] || npu-rl preprocess gsm8k --output-dir "$DATA_DIR"

ray job submit --address="$RAY_ADDRESS" --runtime-env="$(dirname "$0")/runtime_env.yaml" --working-dir . -- \
python3 -m npu_rl.trainer.main_ppo \
  preset=grpo \
  data.train_files="$DATA_DIR/train.parquet" \
  data.val_files="$DATA_DIR/test.parquet" \
  data.train_batch_size=128 \
  data.max_prompt_length=512 \
  data.max_response_length=512 \
  data.filter_overlong_prompts=True \
  data.truncation=error \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  actor_rollout_ref.model.use_remove_padding=True \
  actor_rollout_ref.model.enable_gradient_checkpointing=True \
  actor_rollout_ref.model.use_fused_kernels=True \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.use_dynamic_bsz=True \
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.use_torch_compile=False \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=5 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.enforce_eager=False \
  actor_rollout_ref.rollout.cudagraph_capture_sizes='[8,16,32,64,128]' \
  actor_rollout_ref.ref.use_torch_compile=False \
  trainer.device=npu \
  trainer.nnodes=1 \
  trainer.n_gpus_per_node="$NPUS" \
  trainer.logger='[console,file]' \
  trainer.project_name=npu_rl_gsm8k \
  trainer.experiment_name=qwen2.5-0.5b-grpo \
  trainer.val_before_train=True \
  trainer.test_freq=10 \
  trainer.save_freq=50 \
  trainer.total_epochs=5 "$@"
