#!/usr/bin/env bash
# The H200 calls of issue 27, one subcommand a call, made back to back (the machine keeps /tmp ~30 s after a call).
#
#   bash .whl/src/scripts/gpu/device_calls.sh c1     # from the root of the checkout the device tool sends
#
# Here, before the calls: scripts/gpu/carry_vllm.sh <checkout>/.whl/vllm (parts 1-5) and a copy of this tree in
# <checkout>/.whl/src (git archive); call N carries .whl/vllm/partN and .whl/src. c1-c3 bring vLLM and its wheels
# (c3 then runs the vLLM checks on random-weight shapes), c4 LoRA / parity / sleep level 2, c5 brings the embedded
# model (TRL comparison, the embedded default's wall time), c6 GSM8K. Every result lands in $OUT.
set -uo pipefail
call="$1"
root="$PWD"
src="$root/.whl/src"
out="${OUT:-/tmp/out}"; mkdir -p "$out"
# npu-rl is installed from the carried tree (setup.py maps the top-level kernels/ and configs/ into the package), not
# put on PYTHONPATH; the image has setuptools and wheel, and the machine reaches no index.
python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target /tmp/npu_rl_site "$src" \
  > "$out/install_npu_rl.log" 2>&1 || { echo "installing npu-rl from $src failed:"; tail -5 "$out/install_npu_rl.log"; }
export PYTHONPATH="/tmp/site:/tmp/npu_rl_site" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HOME=/tmp/hf NPU_RL_CACHE=/tmp/npu_rl_cache VLLM_CACHE_ROOT=/tmp/vllm_cache
npu() { python3 -m npu_rl.cli "$@"; }
step() {  # step NAME TIMEOUT_S CMD...: one check, its log under $out, its time and exit code printed
  local name="$1" limit="$2"; shift 2
  local t0=$SECONDS
  (cd "$src" && timeout "$limit" "$@") > "$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc, $((SECONDS - t0)) s"; tail -n "${TAIL:-12}" "$out/$name.log"
}
unpack() { bash "$src/scripts/gpu/carry_vllm.sh" --unpack "$root/.whl/vllm/part$1"; }

case "$call" in
  c1) unpack 1; nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm --format=csv
      python3 -c 'import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())';;
  c2) unpack 2;;
  c3) unpack 3
      step vllm_import 120 python3 -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
      # throughput: vLLM vs hf (eager and compiled), one invocation; its cycle syncs weights (reload_weights, the
      # auto path) and sleeps / wakes (level 1) every repeat
      TAIL=30 step rollout 330 python3 -m npu_rl.cli bench rollout --models shape:qwen2.5-0.5b,shape:qwen2.5-1.5b \
        --engines hf_eager,hf_compiled,vllm --num-prompts 64 --n 4 --prompt-length 128 --response-length 256 \
        --repeats 3 --logprobs --write "$out/rollout.md"
      TAIL=16 NPU_RL_VLLM_WEIGHT_SYNC=load_weights step rollout_load_weights 150 python3 -m npu_rl.cli bench rollout \
        --models shape:qwen2.5-0.5b --engines vllm --num-prompts 64 --n 4 --prompt-length 128 --response-length 256 \
        --repeats 2 --logprobs
      TAIL=20 step trainer_vllm 200 python3 -m npu_rl.cli bench trainer --engine vllm --shape qwen2.5-0.5b \
        --modes fused --steps 4 --model-dir /tmp/q05 --out "$out/trainer_vllm.json";;
  c4) unpack 4
      TAIL=20 step trainer_vllm_sleep2 150 python3 -m npu_rl.cli bench trainer --engine vllm --shape qwen2.5-0.5b \
        --modes fused --steps 3 --out "$out/trainer_vllm_sleep2.json" actor_rollout_ref.rollout.sleep_level=2
      TAIL=20 step trainer_vllm_lora 150 python3 -m npu_rl.cli bench trainer --engine vllm --shape qwen2.5-0.5b \
        --modes fused --steps 3 --out "$out/trainer_vllm_lora.json" actor_rollout_ref.model.lora_rank=16 \
        actor_rollout_ref.model.lora_alpha=32 actor_rollout_ref.model.target_modules=all-linear
      TAIL=20 step trainer_vllm_lora_merge 150 python3 -m npu_rl.cli bench trainer --engine vllm \
        --shape qwen2.5-0.5b --modes fused --steps 3 --out "$out/trainer_vllm_lora_merge.json" \
        actor_rollout_ref.model.lora_rank=16 actor_rollout_ref.model.lora_alpha=32 \
        actor_rollout_ref.model.target_modules=all-linear actor_rollout_ref.model.lora.merge=True
      TAIL=40 step parity 120 python3 -m npu_rl.cli doctor --parity /tmp/q05 actor_rollout_ref.rollout.name=vllm;;
  c5) unpack 5
      # the embedded default, as a first-time user runs it (vLLM installed: the vllm engine)
      TAIL=25 step embedded_vllm 240 python3 -m npu_rl.cli train trainer.default_local_dir=/tmp/runs/embedded
      cp /tmp/runs/embedded/logs/*/metrics.jsonl "$out/embedded_vllm_metrics.jsonl" 2>/dev/null
      TAIL=12 step trl_vs_ours 200 python3 -m npu_rl.cli bench trl --engine vllm --out "$out/trl_vs_ours.json"
      TAIL=12 step ours_hf 90 python3 -m npu_rl.cli bench trl --engine hf --sides ours --out "$out/ours_hf.json"
      TAIL=12 step ours_vllm_mb32 90 python3 -m npu_rl.cli bench trl --engine vllm --sides ours --out "$out/ours_mb32.json" \
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32;;
  c6) gsm=(--task gsm8k --max-new-tokens 384 --batch-size 1319 --samples 4)
      TAIL=30 step gsm8k_before 120 python3 -m npu_rl.cli eval smollm2-135m-instruct "${gsm[@]}" \
        --out "$out/gsm8k_before.json"
      TAIL=30 step gsm8k_train 390 python3 -m npu_rl.cli train trainer.default_local_dir=/tmp/runs/gsm8k \
        data.train_files=builtin://gsm8k/train data.val_files=builtin://gsm8k/test data.train_batch_size=64 \
        data.val_batch_size=1319 data.max_prompt_length=320 data.max_response_length=384 \
        actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64 \
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=128 \
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=128 actor_rollout_ref.actor.optim.lr=1e-5 \
        +custom_reward_function.reward_kwargs.method=flexible trainer.total_training_steps=40 trainer.test_freq=20 \
        trainer.save_freq=40 trainer.experiment_name=gsm8k_smollm2_grpo
      run=$(find /tmp/runs/gsm8k/logs -mindepth 1 -maxdepth 1 -type d | sort | tail -1); cp "$run"/metrics.jsonl "$run"/curves.png \
        "$run"/val_generations.jsonl "$out/" 2>/dev/null
      last=$(find /tmp/runs/gsm8k -maxdepth 1 -name 'global_step_*' | sort -V | tail -1)
      TAIL=30 step gsm8k_after 120 python3 -m npu_rl.cli eval "$last" "${gsm[@]}" --out "$out/gsm8k_after.json";;
  *) echo "unknown call $call"; exit 2;;
esac
