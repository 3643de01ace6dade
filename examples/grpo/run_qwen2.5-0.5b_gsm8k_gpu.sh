#!/usr/bin/env bash
# GRPO (group-relative advantages, KL loss to the reference) on GSM8K, one node of 8 GPUs.
#   bash examples/grpo/run_qwen2.5-0.5b_gsm8k_gpu.sh [key=value ...]    (examples/common.sh: data, model, device settings)
set -euo pipefail
source "$(dirname "$0")/../common.sh"
examples_run gpu \
    preset=grpo \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.rollout.n=5 \
    trainer.experiment_name="grpo_qwen2.5-0.5b_gpu" \
    "$@"
