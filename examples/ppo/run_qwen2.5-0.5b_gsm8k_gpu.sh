#!/usr/bin/env bash
# PPO with a critic (GAE) on GSM8K, one node of 8 GPUs.
#   bash examples/ppo/run_qwen2.5-0.5b_gsm8k_gpu.sh [key=value ...]    (examples/common.sh: data, model, device settings)
set -euo pipefail
source "$(dirname "$0")/../common.sh"
examples_run gpu \
    preset=ppo \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    critic.optim.lr=1e-5 \
    critic.model.path="${MODEL_PATH:-Qwen/Qwen2.5-0.5B-Instruct}" \
    trainer.experiment_name="ppo_qwen2.5-0.5b_gpu" \
    "$@"
