#!/usr/bin/env bash
# Stop the Ray instance the Atlas scripts started for this user, and only it: every process of that instance is in
# the process group of its `ray start` (gcs_server, raylet, dashboard, client server, workers), so the group is
# signalled. `ray stop --force` would kill every Ray process on the node, other users' included.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/ray_common.sh"
pgid=$(ray_instance_pgid)
if [ -z "$pgid" ]; then echo "no running Ray instance under $RAY_TMP"; exit 0; fi
echo "stopping the Ray instance under $RAY_TMP (process group $pgid)"
kill -TERM -- "-$pgid" 2>/dev/null || true
for _ in $(seq 20); do
  pgrep -g "$pgid" >/dev/null || exit 0
  sleep 0.5
done
kill -KILL -- "-$pgid" 2>/dev/null || true
