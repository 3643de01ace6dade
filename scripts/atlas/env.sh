#!/usr/bin/env bash
# Sourced by the Atlas scripts (and by hand before `npu-rl train` on an Ascend node): the CANN environment and the
# settings every NPU process must have when it starts. Each variable below changes something; the reason is beside it.
ASCEND_HOME=${ASCEND_HOME:-/usr/local/Ascend}
for f in "$ASCEND_HOME/ascend-toolkit/set_env.sh" "$ASCEND_HOME/nnal/atb/set_env.sh"; do
  if [ -f "$f" ]; then
    # CANN's set_env.sh reads variables that may be unset (LD_LIBRARY_PATH, PYTHONPATH ...): not under `set -u`.
    case $- in *u*) _npu_rl_nounset=1; set +u;; *) _npu_rl_nounset=0;; esac
    # shellcheck disable=SC1090
    source "$f"
    [ "$_npu_rl_nounset" = 1 ] && set -u
    unset _npu_rl_nounset
  fi
done
# Ray counts this node's NPUs itself; ASCEND_RT_VISIBLE_DEVICES is left alone unless you set it (a restriction of
# your own, e.g. "0,1,2,3", is passed on to Ray).
# HCCL_CONNECT_TIMEOUT: default 120 s; links between many nodes take longer to come up on large clusters.
# (HCCL_EXEC_TIMEOUT is not set: its default, 1836 s, is already longer than the 1800 s this script used to set.)
export HCCL_CONNECT_TIMEOUT=${HCCL_CONNECT_TIMEOUT:-1800}
# HCCL_IF_BASE_PORT: HCCL's default base port 60000 lies inside Linux's ephemeral port range (32768-60999), where
# Ray's and Gloo's outgoing connections can take it first; 64247 is above that range.
export HCCL_IF_BASE_PORT=${HCCL_IF_BASE_PORT:-64247}
# The NIC HCCL and Gloo use between nodes (set it when the default route is not the fast fabric).
if [ -n "${SOCKET_IFNAME:-}" ]; then export HCCL_SOCKET_IFNAME=$SOCKET_IFNAME GLOO_SOCKET_IFNAME=$SOCKET_IFNAME; fi
# TASK_QUEUE_ENABLE: torch_npu's dispatch queue (1 = its default; 2 = also pipelines operator launch, what
# vllm-ascend's tuning guide recommends, a little more peak memory). torch_npu reads it at import, so it must be
# exported here, before any Python process starts; Ray workers inherit it through the raylet.
export TASK_QUEUE_ENABLE=${TASK_QUEUE_ENABLE:-1}
# VLLM_ASCEND_ENABLE_NZ=0: the RL rollout puts vLLM to sleep between steps, and vllm-ascend's wake_up raises with
# the NZ weight layout on (its default); weights synced in place also need the plain layout. Read by vllm-ascend
# before 0.27.1rc1 only: newer releases take additional_config={"weight_nz_mode": 0}, which npu-rl's engine passes.
export VLLM_ASCEND_ENABLE_NZ=${VLLM_ASCEND_ENABLE_NZ:-0}
# CPU_AFFINITY_CONF=1: torch_npu binds each process to the cores of its NPU's NUMA node (read when libtorch_npu
# loads). npu-rl turns vllm-ascend's own binding off (it would taskset the whole trainer process).
export CPU_AFFINITY_CONF=${CPU_AFFINITY_CONF:-1}
# DEVICE: npu on an Atlas node (a rehearsal on a CPU machine sets DEVICE=cpu before sourcing this file).
export DEVICE=${DEVICE:-npu}
