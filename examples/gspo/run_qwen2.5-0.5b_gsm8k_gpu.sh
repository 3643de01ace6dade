#!/usr/bin/env bash
# GSPO (sequence-level importance ratio) on GSM8K, one node of 8 GPUs.
#   bash examples/gspo/run_qwen2.5-0.5b_gsm8k_gpu.sh [key=value ...]    (examples/common.sh: data, model, device settings)
set -euo pipefail
source "$(dirname "$0")/../common.sh"
examples_run gpu \
    preset=gspo \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    trainer.experiment_name="gspo_qwen2.5-0.5b_gpu" \
    "$@"
