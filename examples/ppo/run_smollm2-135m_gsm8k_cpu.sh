#!/usr/bin/env bash
# PPO with a critic (GAE) on GSM8K, CPU with the embedded SmolLM2-135M (a smoke run).
#   bash examples/ppo/run_smollm2-135m_gsm8k_cpu.sh [key=value ...]    (examples/common.sh: data, model, device settings)
set -euo pipefail
source "$(dirname "$0")/../common.sh"
examples_run cpu \
    preset=ppo \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    critic.optim.lr=1e-5 \
    critic.model.path="${MODEL_PATH:-smollm2-135m-instruct}" \
    trainer.experiment_name="ppo_smollm2-135m_cpu" \
    "$@"
