#!/usr/bin/env bash
# PPO with a critic (GAE) on GSM8K, one Atlas node (8 NPUs; DEVICES=16 on an A3 node).
#   bash examples/ppo/run_qwen2.5-0.5b_gsm8k_npu.sh [key=value ...]    (examples/common.sh: data, model, device settings)
set -euo pipefail
source "$(dirname "$0")/../common.sh"
examples_run npu \
    preset=ppo \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    critic.optim.lr=1e-5 \
    critic.model.path="${MODEL_PATH:-Qwen/Qwen2.5-0.5B-Instruct}" \
    trainer.experiment_name="ppo_qwen2.5-0.5b_npu" \
    "$@"
