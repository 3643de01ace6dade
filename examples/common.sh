# shellcheck shell=bash
# Sourced by every examples/<algorithm>/run_*.sh: one place for the data, model and device settings, so that each
# example only says what is particular to its algorithm (verl's examples/<algo>_trainer/run_*.sh, npu-rl's keys).
#
#   bash examples/grpo/run_qwen2.5-0.5b_gsm8k_npu.sh [more key=value overrides]
#
# Environment: MODEL_PATH (an HF folder; default Qwen/Qwen2.5-0.5B-Instruct, fetched only when online),
# DEVICES (devices per node, default 8), NNODES (default 1), NPU_RL_TRAIN (the command; default `npu-rl train`,
# e.g. `ray job submit --working-dir . -- python -m npu_rl.trainer.main_ppo` on a cluster).
# Data: the GSM8K copy shipped in the package (builtin://gsm8k/...), nothing to preprocess.
# None of these was run to the end in this repository (no NPU or GPU here; the cpu ones take hours on 2 cores);
# tests/project/test_examples.py checks that every example composes into a valid config.

examples_run() {  # examples_run <npu|gpu|cpu> <algorithm overrides...>
    local device=$1
    shift
    local common=(
        --config-name ppo_trainer
        data.train_files=builtin://gsm8k/train
        data.val_files=builtin://gsm8k/test
        data.max_prompt_length=512
        data.max_response_length=1024
        data.filter_overlong_prompts=True
        trainer.logger='[console,file,tensorboard]'
        trainer.project_name=npu_rl_examples
        trainer.val_before_train=True
        trainer.test_freq=10
        trainer.save_freq=50
        trainer.total_epochs=15
    )
    local dev=()
    case "$device" in
        npu|gpu)
            dev=(
                trainer.device="$([ "$device" = npu ] && echo npu || echo cuda)"
                trainer.nnodes="${NNODES:-1}"
                trainer.n_gpus_per_node="${DEVICES:-8}"
                actor_rollout_ref.model.path="${MODEL_PATH:-Qwen/Qwen2.5-0.5B-Instruct}"
                actor_rollout_ref.model.use_remove_padding=True
                actor_rollout_ref.model.enable_gradient_checkpointing=True
                actor_rollout_ref.actor.use_dynamic_bsz=True
                actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384
                actor_rollout_ref.rollout.name=vllm
                actor_rollout_ref.rollout.tensor_model_parallel_size=1
                actor_rollout_ref.rollout.gpu_memory_utilization=0.6
                data.train_batch_size=256
                actor_rollout_ref.actor.ppo_mini_batch_size=64
                actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
                actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
                actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16
                critic.ppo_micro_batch_size_per_gpu=8
            ) ;;
        cpu)  # the embedded SmolLM2-135M on a laptop: a smoke run, not a result
            dev=(
                trainer.device=cpu
                actor_rollout_ref.rollout.tensor_model_parallel_size=1
                trainer.n_gpus_per_node=1
                actor_rollout_ref.model.path="${MODEL_PATH:-smollm2-135m-instruct}"
                data.train_batch_size=4
                data.max_response_length=128
                actor_rollout_ref.actor.ppo_mini_batch_size=4
                actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
                actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
                actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8
                critic.ppo_micro_batch_size_per_gpu=4
                data.dataloader_num_workers=0
                trainer.total_training_steps=20
            ) ;;
        *) echo "examples_run: unknown device $device (npu | gpu | cpu)" >&2; return 2 ;;
    esac
    # shellcheck disable=SC2086
    ${NPU_RL_TRAIN:-npu-rl train} "${common[@]}" "${dev[@]}" "$@"
}
