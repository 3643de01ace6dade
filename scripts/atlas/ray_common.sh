#!/usr/bin/env bash
# Shared by the Atlas Ray scripts. This user's Ray instance lives in its own temp folder, so that stop_ray.sh stops
# only it (`ray stop --force` would kill every Ray process on the node, other users' included).
RAY_TMP=${RAY_TMP:-/tmp/ray_${USER:-$(id -un)}_npu_rl}

# Ray detects Ascend NPUs itself (its accelerator manager calls pyACL, `import acl`, which CANN's set_env.sh puts on
# PYTHONPATH) and registers the resource "NPU" with the count it finds: 8 on an A2 node, 16 on an A3 node. Only a
# number you give (NPUS_PER_NODE) overrides it.
npu_resource_args() {
  if [ -n "${NPUS_PER_NODE:-}" ]; then printf -- '--resources={"NPU":%s}' "$NPUS_PER_NODE"; fi
}

# RAY_START_ARGS: more `ray start` options, word-split (e.g. "--num-cpus=32 --object-store-memory=200000000000").
ray_start_args() {
  if [ -n "${RAY_START_ARGS:-}" ]; then printf '%s\n' "$RAY_START_ARGS"; fi
}

npu_count_note() {
  if [ -n "${NPUS_PER_NODE:-}" ]; then echo "offering $NPUS_PER_NODE NPUs (NPUS_PER_NODE)"
  else echo "offering the NPUs Ray detected (ray status lists them)"; fi
}

refuse_if_port_taken() {
  if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
    echo "port $1 is in use (another Ray head?); stop yours with scripts/atlas/stop_ray.sh or pick RAY_PORT" >&2
    exit 1
  fi
}

# The process group of this user's running instance: that of its gcs_server / raylet, found by the temp folder on
# their command lines (empty when none runs).
ray_instance_pgid() {
  local pid
  pid=$(pgrep -u "$(id -u)" -f -- "(gcs_server|raylet).*$RAY_TMP/" | head -n 1 || true)
  if [ -n "$pid" ]; then ps -o pgid= -p "$pid" | tr -d ' '; fi
}

refuse_if_running() {
  if [ -n "$(ray_instance_pgid)" ]; then
    echo "a Ray instance of yours already runs under $RAY_TMP; stop it first: bash scripts/atlas/stop_ray.sh" >&2
    exit 1
  fi
}
