#!/usr/bin/env bash
# ReMax (greedy rollout as the baseline) on GSM8K, one Atlas node (8 NPUs; DEVICES=16 on an A3 node).
#   bash examples/remax/run_qwen2.5-0.5b_gsm8k_npu.sh [key=value ...]    (examples/common.sh: data, model, device settings)
set -euo pipefail
source "$(dirname "$0")/../common.sh"
examples_run npu \
    preset=remax \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    trainer.experiment_name="remax_qwen2.5-0.5b_npu" \
    "$@"
