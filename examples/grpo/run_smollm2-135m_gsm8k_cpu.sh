#!/usr/bin/env bash
# GRPO (group-relative advantages, KL loss to the reference) on GSM8K, CPU with the embedded SmolLM2-135M (a smoke run).
#   bash examples/grpo/run_smollm2-135m_gsm8k_cpu.sh [key=value ...]    (examples/common.sh: data, model, device settings)
set -euo pipefail
source "$(dirname "$0")/../common.sh"
examples_run cpu \
    preset=grpo \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.rollout.n=5 \
    trainer.experiment_name="grpo_smollm2-135m_cpu" \
    "$@"
