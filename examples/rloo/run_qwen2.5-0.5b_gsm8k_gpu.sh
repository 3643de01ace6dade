#!/usr/bin/env bash
# RLOO (leave-one-out baseline) on GSM8K, one node of 8 GPUs.
#   bash examples/rloo/run_qwen2.5-0.5b_gsm8k_gpu.sh [key=value ...]    (examples/common.sh: data, model, device settings)
set -euo pipefail
source "$(dirname "$0")/../common.sh"
examples_run gpu \
    preset=rloo \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    trainer.experiment_name="rloo_qwen2.5-0.5b_gpu" \
    "$@"
