#!/usr/bin/env bash
# Sourced by the Atlas scripts: the CANN environment and the HCCL settings every NPU process needs.
# Adjust ASCEND_HOME to your install; nothing here is specific to npu-rl.
ASCEND_HOME=${ASCEND_HOME:-/usr/local/Ascend}
for f in "$ASCEND_HOME/ascend-toolkit/set_env.sh" "$ASCEND_HOME/nnal/atb/set_env.sh"; do
  # shellcheck disable=SC1090
  [ -f "$f" ] && source "$f"
done
# Which NPUs this node lends to Ray (all 8 or 16 by default); Ray hands each worker one of them.
export ASCEND_RT_VISIBLE_DEVICES=${ASCEND_RT_VISIBLE_DEVICES:-$(seq -s, 0 $(( ${NPUS_PER_NODE:-8} - 1 )))}
# Links between nodes take longer to come up than HCCL's defaults allow on large clusters.
export HCCL_CONNECT_TIMEOUT=${HCCL_CONNECT_TIMEOUT:-1800}
export HCCL_EXEC_TIMEOUT=${HCCL_EXEC_TIMEOUT:-1800}
export HCCL_IF_BASE_PORT=${HCCL_IF_BASE_PORT:-64247}
# The NIC HCCL and Gloo use between nodes (set it when the default route is not the fast fabric).
[ -n "${SOCKET_IFNAME:-}" ] && export HCCL_SOCKET_IFNAME=$SOCKET_IFNAME GLOO_SOCKET_IFNAME=$SOCKET_IFNAME
# vllm-ascend graph mode (ACL graphs, FULL_DECODE_ONLY) needs the task queue on.
export TASK_QUEUE_ENABLE=${TASK_QUEUE_ENABLE:-1}
export DEVICE=npu
