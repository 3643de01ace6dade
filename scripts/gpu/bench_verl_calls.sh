#!/usr/bin/env bash
# `npu-rl bench verl` on the H200: verl 0.9.1, vLLM 0.22.0 and their runtime carried in parts, then the rows.
#
# Here, once:   WITH_VERL=1 VLLM_ONLY=1 scripts/gpu/carry_vllm.sh .whl/verl 56  (4 parts of <= 56 MB: with the ~8 MB
#               checkout, under the 64 MiB a call carries; the TRL wheels must stay out; the embedded row also needs
#               the GGUF: see carry_vllm.sh)
# There, one call a part, back to back (a warm machine keeps /tmp ~30 s between calls), from the checkout's root:
#   bash scripts/gpu/bench_verl_calls.sh unpack 1          # carry .whl/verl/part1
#   ...
#   bash scripts/gpu/bench_verl_calls.sh unpack 4 && bash scripts/gpu/bench_verl_calls.sh row q05
# A call may run 600 s: a row whose two sides do not fit runs one side a call (`row q7-1k --sides verl --timeout 560`,
# then `row q7-1k --sides ours --timeout 560`): the bench folder /tmp/bench-ROW keeps the first call's run, and the
# second call's report shows both. verl's first attempt (2026-12-03) had not left vLLM's server start after 265 s
# (silent: verl sets VLLM_LOGGING_LEVEL=WARN unless the shell sets it); run it with DIAG_AFTER="200 350 480".
# What verl took on an H100 (2026-12-07, docs/benchmarks.md): q05 285 s for 3 steps (~200 s before the first);
# q05-1k ~240 s to start and 184 s for its first step, so 3 steps do not fit one call: `row q05-1k --sides verl
# --steps 2 --timeout 560` (a first and one steady step; then ours with the same --steps), larger rows likewise.
# TRL as a third side: `row q05 --sides trl` (its vLLM colocate mode; TRL is carried into /tmp/trl_site).
# Rows (each one `npu-rl bench verl` invocation; figures and logs under $OUT):
#   embedded  the embedded task (SmolLM2-135M, arithmetic) as a first-time user runs it, cold then warm
#   q05       Qwen2.5-0.5B shape, 16 prompts x 4, 128 + 256 tokens (the TRL table's row)
#   q05-1k    Qwen2.5-0.5B shape, 32 prompts x 8, 1024 + 1024 tokens (verl's GSM8K script lengths)
#   q15-1k    Qwen2.5-1.5B shape, the same
#   q7-1k     Qwen2.5-7B shape, 16 prompts x 8, 1024 + 1024 tokens
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${OUT:-/tmp/out}"; mkdir -p "$out"

case "${1:?usage: bench_verl_calls.sh unpack N | row NAME [extra args]}" in
  unpack) bash "$here/carry_vllm.sh" --unpack "$root/.whl/verl/part$2"; exit $?;;
  row) ;;
  *) echo "bench_verl_calls.sh: unknown call $1" >&2; exit 2;;
esac
row="$2"; shift 2
# npu-rl installed from the checkout (setup.py maps the top-level kernels/ and configs/ into the package); the
# checkout root is not put on sys.path: its kernels/ folder would shadow the `kernels` package transformers probes
[ -d /tmp/npu_rl_site/npu_rl ] || python3 -m pip install -q --no-deps --no-build-isolation --no-index \
  --target /tmp/npu_rl_site "$root" > "$out/install_npu_rl.log" 2>&1 ||
  { echo "installing npu-rl failed:"; tail -5 "$out/install_npu_rl.log"; exit 1; }
export PYTHONPATH="/tmp/site:/tmp/npu_rl_site" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HOME=/tmp/hf NPU_RL_CACHE=/tmp/npu_rl_cache RAY_DEDUP_LOGS=0 RAY_USAGE_STATS_ENABLED=0
# verl turns vLLM down to WARN (its Ray runtime env) unless the shell sets it: INFO says what the engine is doing
export VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-INFO}"
# DIAG_AFTER="200 330 460": at those seconds from the row's start, a snapshot under $out/$row-diag-T (processes, GPU,
# sockets, every Python process's stacks: each one dumps its own threads to its stderr on SIGUSR2 through the
# sitecustomize below, which Ray keeps in its worker logs; py-spy too where ptrace is allowed), Ray's logs copied
# each time: a run that hangs until the call's limit still says where it waits
ray_logs() {
  mkdir -p "$1"
  for f in /tmp/ray/session_latest/logs/worker-*.{out,err} /tmp/ray/session_latest/logs/raylet.out; do
    [ -s "$f" ] && tail -c 200000 "$f" > "$1/$(basename "$f")"
  done
}
if [ -n "${DIAG_AFTER:-}" ]; then
  mkdir -p /tmp/diag
  printf '%s\n' 'import faulthandler, signal' \
    'if signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL:' \
    '    faulthandler.register(signal.SIGUSR2, all_threads=True)' > /tmp/diag/sitecustomize.py
  export PYTHONPATH="/tmp/diag:$PYTHONPATH"
  (
    started=$SECONDS
    for t in $DIAG_AFTER; do
      sleep $((t - (SECONDS - started))) 2>/dev/null || true
      d="$out/$row-diag-$t"; mkdir -p "$d"
      ps -eo pid,ppid,etimes,stat,pcpu,rss,args --forest > "$d/ps.txt" 2>&1
      nvidia-smi > "$d/nvidia-smi.txt" 2>&1
      (ss -ltnp || netstat -ltnp) > "$d/listening.txt" 2>&1
      for p in /proc/[0-9]*; do
        case "$(readlink "$p/exe" 2>/dev/null)" in
          *python*) pid=${p#/proc/}  # only the processes started with the handler (PYTHONPATH names /tmp/diag)
                    tr '\0' '\n' < "$p/environ" 2>/dev/null | grep -q '^PYTHONPATH=.*/tmp/diag' || continue
                    /tmp/site/bin/py-spy dump --pid "$pid" >> "$d/py-spy.txt" 2>&1
                    kill -USR2 "$pid" 2>/dev/null;;
        esac
      done
      sleep 2; ray_logs "$d/ray"
    done
  ) &
  diag=$!
fi
trl=(); [ -d /tmp/trl_site/trl ] && trl=(--trl-site /tmp/trl_site)  # TRL apart from verl (carry_vllm.sh)
# the sides' logs are copied under $out every 15 s: a call cut off at the device's limit still brings back how far
# each side got (2026-12-07: a call killed at its limit brought back nothing but the model folder's progress bar)
copy_logs() { for f in /tmp/bench-"$row"/*.log; do [ -f "$f" ] && cp "$f" "$out/$row-$(basename "$f")"; done; }
( while sleep 15; do copy_logs; done ) &
copier=$!
bench() { python3 -m npu_rl.cli bench verl --dir "/tmp/bench-$row" --out "$out/$row.json" "${trl[@]}" "$@"; }
case "$row" in
  embedded) bench --repeat 2 "$@";;
  q05) bench --model shape:qwen2.5-0.5b --prompts 16 --n 4 --prompt-length 128 --response-length 256 --steps 5 \
         --ignore-eos "$@";;
  q05-1k) bench --model shape:qwen2.5-0.5b --prompts 32 --n 8 --prompt-length 1024 --response-length 1024 \
            --steps 4 --micro-batch 8 --ignore-eos "$@";;
  q15-1k) bench --model shape:qwen2.5-1.5b --prompts 32 --n 8 --prompt-length 1024 --response-length 1024 \
            --steps 4 --micro-batch 8 --ignore-eos "$@";;
  q7-1k) bench --model shape:qwen2.5-7b --prompts 16 --n 8 --prompt-length 1024 --response-length 1024 \
           --steps 3 --micro-batch 4 --gpu-memory-utilization 0.4 --ignore-eos "$@";;
  *) echo "bench_verl_calls.sh: unknown row $row" >&2; exit 2;;
esac
rc=$?
kill "$copier" 2>/dev/null
copy_logs
[ -n "${diag:-}" ] && kill "$diag" 2>/dev/null
# Ray's worker logs (verl's vLLM server and its engine process log there, not to the driver): the last 200 KB of each
ray_logs "$out/$row-ray"
exit $rc
