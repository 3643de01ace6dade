#!/usr/bin/env bash
# DAPO (clip-higher, dynamic sampling of groups with mixed rewards) on GSM8K, one node of 8 GPUs.
#   bash examples/dapo/run_qwen2.5-0.5b_gsm8k_gpu.sh [key=value ...]    (examples/common.sh: data, model, device settings)
set -euo pipefail
source "$(dirname "$0")/../common.sh"
examples_run gpu \
    preset=dapo \
    actor_rollout_ref.rollout.n=8 \
    data.gen_batch_size="${GEN_BATCH:-384}" \
    trainer.experiment_name="dapo_qwen2.5-0.5b_gpu" \
    "$@"
