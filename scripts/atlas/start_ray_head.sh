#!/usr/bin/env bash
# Start the Ray head on this Atlas node, offering its NPUs as the Ray resource "NPU".
#   NPUS_PER_NODE=16 bash scripts/atlas/start_ray_head.sh
# Then on every other node: HEAD_IP=<this node's IP> bash scripts/atlas/start_ray_worker.sh
set -euo pipefail
source "$(dirname "$0")/env.sh"
NPUS_PER_NODE=${NPUS_PER_NODE:-8}
HEAD_IP=${HEAD_IP:-$(hostname -I | awk '{print $1}')}
ray stop --force >/dev/null 2>&1 || true
ray start --head --node-ip-address="$HEAD_IP" --port=6379 --dashboard-host=0.0.0.0 --dashboard-port=8265 \
  --resources="{\"NPU\": $NPUS_PER_NODE}" --disable-usage-stats
echo "Ray head at $HEAD_IP:6379 (dashboard and job API at http://$HEAD_IP:8265) with $NPUS_PER_NODE NPUs"
npu-rl doctor || true
