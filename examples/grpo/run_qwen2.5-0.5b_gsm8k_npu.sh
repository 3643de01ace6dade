#!/usr/bin/env bash
# GRPO (group-relative advantages, KL loss to the reference) on GSM8K, one Atlas node (8 NPUs; DEVICES=16 on an A3 node).
#   bash examples/grpo/run_qwen2.5-0.5b_gsm8k_npu.sh [key=value ...]    (examples/common.sh: data, model, device settings)
set -euo pipefail
source "$(dirname "$0")/../common.sh"
examples_run npu \
    preset=grpo \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.rollout.n=5 \
    trainer.experiment_name="grpo_qwen2.5-0.5b_npu" \
    "$@"
