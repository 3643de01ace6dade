#!/usr/bin/env bash
# Container entrypoint: set up the Ascend environment when the image has one, then run npu-rl.
#
#   <image>                       -> npu-rl doctor (the image's CMD)
#   <image> train k=v ...         -> npu-rl train k=v ...   (any npu-rl sub-command: train eval merge convert preprocess migrate plan
#                                                             doctor plot bench, or -h / --help)
#   <image> bash | python3 | ...  -> that program (anything that is not a sub-command runs as given)
set -euo pipefail

# CANN: its set_env.sh exports the library paths torch_npu needs; the vllm-ascend images source it in their
# shell profile only, which `docker run <image> cmd` does not read. NPU_RL_CANN_SET_ENV overrides the path.
for setenv in "${NPU_RL_CANN_SET_ENV:-}" /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/nnal/atb/set_env.sh; do
    if [[ -n "$setenv" && -f "$setenv" ]]; then
        set +eu
        # shellcheck disable=SC1090
        source "$setenv"
        set -eu
    fi
done

if [[ $# -eq 0 ]]; then
    set -- doctor
fi
case "$1" in
    train|eval|merge|convert|preprocess|migrate|doctor|plot|plan|bench|-h|--help|help)
        exec npu-rl "$@" ;;
    *)
        exec "$@" ;;
esac
