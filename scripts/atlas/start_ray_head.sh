#!/usr/bin/env bash
# Start a Ray head on this Atlas node; Ray counts the node's NPUs and offers them as the resource "NPU".
#   bash scripts/atlas/start_ray_head.sh                 # all NPUs Ray finds (8 on A2, 16 on A3)
#   NPUS_PER_NODE=4 bash scripts/atlas/start_ray_head.sh # offer only 4
# Then on every other node: HEAD_IP=<this node's IP> bash scripts/atlas/start_ray_worker.sh
# Stop it with: bash scripts/atlas/stop_ray.sh (only this instance; other users' Ray on the node is left alone).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/env.sh"
source "$here/ray_common.sh"
refuse_if_running
HEAD_IP=${HEAD_IP:-$(hostname -I | awk '{print $1}')}
RAY_PORT=${RAY_PORT:-6379}
refuse_if_port_taken "$RAY_PORT"
# shellcheck disable=SC2046
ray start --head --node-ip-address="$HEAD_IP" --port="$RAY_PORT" --dashboard-host=0.0.0.0 --dashboard-port="${DASHBOARD_PORT:-8265}" \
  --temp-dir="$RAY_TMP" $(npu_resource_args) $(ray_start_args) --disable-usage-stats
echo "Ray head at $HEAD_IP:$RAY_PORT (dashboard and job API at http://$HEAD_IP:${DASHBOARD_PORT:-8265}); $(npu_count_note)"
# NPU_RL_DOCTOR=0 skips the check (a rehearsal on a machine without NPUs).
if [ "${NPU_RL_DOCTOR:-1}" != 0 ]; then
  npu-rl doctor || echo "npu-rl doctor found problems (above); fix them before training"
fi
