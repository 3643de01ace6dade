#!/usr/bin/env bash
# Join this Atlas node to the Ray cluster started by start_ray_head.sh; Ray counts the NPUs unless NPUS_PER_NODE is set.
#   HEAD_IP=10.0.0.1 bash scripts/atlas/start_ray_worker.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/env.sh"
source "$here/ray_common.sh"
refuse_if_running
: "${HEAD_IP:?set HEAD_IP to the address of the head node}"
NODE_IP=${NODE_IP:-$(hostname -I | awk '{print $1}')}
# shellcheck disable=SC2046
ray start --address="$HEAD_IP:${RAY_PORT:-6379}" --node-ip-address="$NODE_IP" --temp-dir="$RAY_TMP" \
  $(npu_resource_args) $(ray_start_args) --disable-usage-stats
echo "joined $HEAD_IP:${RAY_PORT:-6379}; $(npu_count_note)"
