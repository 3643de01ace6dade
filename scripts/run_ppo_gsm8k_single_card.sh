#!/usr/bin/env bash
# PPO (GAE + critic) on GSM8K on one card: verl's single-GPU quick-start run, ported to npu-rl.
# The only change from the verl script is the module name. Works on an Ascend NPU, a GPU or (slowly) a CPU.
#
#   MODEL_PATH=/models/Qwen2.5-0.5B-Instruct bash scripts/run_ppo_gsm8k_single_card.sh
#
# Data: `npu-rl preprocess gsm8k --output-dir $DATA_DIR` writes train.parquet / test.parquet from the data sets shipped in the package.
set -euo pipefail
MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a Hugging Face model folder (e.g. Qwen2.5-0.5B-Instruct)}
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
[ -f "$DATA_DIR/train.parquet" ] || npu-rl preprocess gsm8k --output-dir "$DATA_DIR"

PYTHONUNBUFFERED=1 python3 -m npu_rl.trainer.main_ppo \
  data.train_files="$DATA_DIR/train.parquet" \
  data.val_files="$DATA_DIR/test.parquet" \
  data.train_batch_size=256 \
  data.max_prompt_length=512 \
  data.max_response_length=256 \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
  critic.optim.lr=1e-5 \
  critic.model.path="$MODEL_PATH" \
  critic.ppo_micro_batch_size_per_gpu=4 \
  algorithm.kl_ctrl.kl_coef=0.001 \
  trainer.logger=console \
  trainer.val_before_train=False \
  trainer.n_gpus_per_node=1 \
  trainer.nnodes=1 \
  trainer.save_freq=10 \
  trainer.test_freq=10 \
  trainer.total_epochs=15 "$@" 2>&1 | tee npu_rl_ppo_gsm8k.log
