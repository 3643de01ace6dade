#!/usr/bin/env bash
# Join this Atlas node to the Ray cluster started by start_ray_head.sh.
#   HEAD_IP=10.0.0.1 NPUS_PER_NODE=16 bash scripts/atlas/start_ray_worker.sh
set -euo pipefail
source "$(dirname "$0")/env.sh"
: "${HEAD_IP:?set HEAD_IP to the head node's address}"
NPUS_PER_NODE=${NPUS_PER_NODE:-8}
NODE_IP=${NODE_IP:-$(hostname -I | awk '{print $1}')}
ray stop --force >/dev/null 2>&1 || true
ray start --address="$HEAD_IP:6379" --node-ip-address="$NODE_IP" --resources="{\"NPU\": $NPUS_PER_NODE}" \
  --disable-usage-stats
echo "joined $HEAD_IP:6379 with $NPUS_PER_NODE NPUs"
