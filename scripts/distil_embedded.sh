#!/usr/bin/env bash
# On-policy distillation on the embedded default (issue 37; figures in docs/benchmarks.md): a GRPO run on arith makes
# a teacher out of SmolLM2-135M-Instruct, its checkpoint is merged into a Hugging Face folder, and the untrained
# SmolLM2 (the student) is distilled from it on the same prompts with verl's example settings (k1 as a
# policy-gradient reward, no task reward: the student never sees the arithmetic reward). Each run prints the
# held-out accuracy before and after (the teacher's is the GRPO run's last).
#
#   bash scripts/distil_embedded.sh [WORK_DIR] [more overrides for the distillation run]
#
# WORK_DIR (default: a fresh `mktemp -d`) receives grpo/ (the teacher's run), teacher/ (the merged folder) and
# distil/ (the student's run). GRPO_STEPS (default 5) and DISTIL_STEPS (default 10) set the runs' lengths (the
# embedded default's 15 GRPO steps give a stronger teacher: 0.88-0.96 held-out instead of 0.80).
set -euo pipefail
WORK=${1:-$(mktemp -d)}
shift || true
NPU_RL=${NPU_RL:-npu-rl}
echo "distil_embedded: work folder $WORK"

$NPU_RL train trainer.default_local_dir="$WORK/grpo" trainer.total_training_steps="${GRPO_STEPS:-5}"
$NPU_RL merge "$WORK/grpo" --out "$WORK/teacher"
$NPU_RL train trainer.default_local_dir="$WORK/distil" trainer.experiment_name=quickstart_arith_distil \
  trainer.total_training_steps="${DISTIL_STEPS:-10}" \
  distillation.enabled=True \
  distillation.teacher_models.teacher_model.model_path="$WORK/teacher" \
  distillation.distillation_loss.loss_mode=k1 \
  distillation.distillation_loss.use_policy_gradient=True \
  distillation.distillation_loss.use_task_rewards=False \
  distillation.distillation_loss.loss_max_clamp=10.0 "$@"
