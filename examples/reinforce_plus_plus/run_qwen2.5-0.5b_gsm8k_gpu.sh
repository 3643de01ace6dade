#!/usr/bin/env bash
# REINFORCE++ (batch-normalised returns, k2 KL loss) on GSM8K, one node of 8 GPUs.
#   bash examples/reinforce_plus_plus/run_qwen2.5-0.5b_gsm8k_gpu.sh [key=value ...]    (examples/common.sh: data, model, device settings)
set -euo pipefail
source "$(dirname "$0")/../common.sh"
examples_run gpu \
    preset=reinforce_plus_plus \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    trainer.experiment_name="reinforce_plus_plus_qwen2.5-0.5b_gpu" \
    "$@"
