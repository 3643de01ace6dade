#!/usr/bin/env bash
# DAPO (clip-higher, dynamic sampling of groups with mixed rewards) on GSM8K, one Atlas node (8 NPUs; DEVICES=16 on an A3 node).
#   bash examples/dapo/run_qwen2.5-0.5b_gsm8k_npu.sh [key=value ...]    (examples/common.sh: data, model, device settings)
set -euo pipefail
source "$(dirname "$0")/../common.sh"
examples_run npu \
    preset=dapo \
    actor_rollout_ref.rollout.n=8 \
    data.gen_batch_size="${GEN_BATCH:-384}" \
    trainer.experiment_name="dapo_qwen2.5-0.5b_npu" \
    "$@"
