"""The ``hf`` rollout engine: transformers ``generate`` on the actor's own module (or a copy of it).

Colocated design: the engine holds a reference to the actor's ``nn.Module`` in the same process, so after an
optimizer step it already generates with the new weights: ``needs_weight_sync`` is False and ``update_weights``
returns at once without reading its iterator (a lazy FSDP gather never starts). Built with its own copy
(``shares_actor_module=False``, e.g. :meth:`HFRolloutEngine.from_pretrained`), the engine copies streamed tensors
into that copy by HF name.

Sampling. ``generate`` runs under ``torch.no_grad()``, not ``inference_mode``: inference tensors cannot be saved
for backward, and the trainer trains on these tokens. transformers' own temperature / top-k / top-p warpers are
switched off and :class:`SamplingProcessor` applies them instead (temperature, then top-k, then top-p, as vLLM
does), so it can also record the log-probs of the distribution each token was actually drawn from:

- ``rollout_logprobs`` = log_softmax(warped logits)[sampled token]: temperature-scaled; with top-k / top-p the
  distribution is truncated and renormalised over the kept tokens, so these are >= the full-vocabulary log-probs
  the actor recomputes (vLLM's ``processed_logprobs`` are the same thing). Greedy decoding (``do_sample=False``
  or temperature 0) records the unscaled log_softmax(logits).
- Memory: one step's [B*n, V] log-probs at a time (the token drawn at step t is read back from ``input_ids`` at
  step t + 1), never the [steps, B*n, V] scores that ``output_scores=True`` would keep.

Compiled decoding (``compiled_decode``: ``Backend.compiled_decode``, off with ``rollout.enforce_eager``):
transformers' static KV cache, with which ``generate`` compiles the model's forward (``torch.compile``,
``mode="reduce-overhead"``: replayed as device graphs). Decoding a small model is host-bound (one Python pass over
every layer per token); replayed graphs remove that. The first ``generate`` of each batch shape compiles (tens of
seconds). Not used on a module with FSDP2 hooks (``gather_full_weights=False``), on a PEFT model, or when
``rollout.engine_kwargs.hf`` names its own ``cache_implementation``.

FSDP2. On a sharded actor module, ``generate`` runs inside :func:`npu_rl.parallel.unshard.unsharded`: the full
weights are gathered once per call (not once per decoded token), each rank decodes its own prompts without
collectives, and the weights are freed afterwards; the gather's time and memory land in the metrics ``generate`` returns
(``gather_full_weights=False`` keeps the per-token gathers and ``synced_gpus``: less memory, far slower).

Images (a Qwen-VL module, rows with ``multi_modal_inputs``; npu_rl.models.vision): each prompt's images are encoded
once (one vision-tower call over the batch's distinct prompts, ``encode_images``) and its ``n`` samples hand
``generate`` the same features (``mm_encoder_outputs``), with the rows' ``image_grid_thw`` and ``mm_token_type_ids``
(1 on ``<|image_pad|>``) from which transformers computes the 3-D rotary ids of the prefill and their deltas for the
decoded tokens; where the module cannot take features, the pixels go to ``generate`` repeated per sample and the
prefill's tower call still computes each prompt's images once (npu_rl.models.vision_dedup). The vision placeholder
tokens are never sampled (``vision_token_ids``): the recorded log-probs are of that distribution, renormalised
without them (as top-k truncates), while the actor recomputes full-vocabulary ones. Decoding stays eager for such a
module (compiled decoding of a Qwen-VL model is not verified).

Other transformers generation settings (e.g. ``repetition_penalty``) pass through ``rollout.engine_kwargs.hf``;
the model folder's own ``generation_config.json`` sampling defaults are NOT applied (RL needs the configured
distribution, not e.g. Qwen2.5-Instruct's top_k=20, top_p=0.8).
"""

from __future__ import annotations

import difflib
import inspect
import logging
import time
from contextlib import nullcontext
from dataclasses import replace
from typing import Any, Callable, Iterable, Sequence

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from npu_rl.device import get_backend
from npu_rl.models.moe import GenerationRouting
from npu_rl.models.vision import MULTI_MODAL_KEY, encode_images, multi_modal_kwargs, placeholder_token_ids
from npu_rl.models.vision_dedup import vision_dedup
from npu_rl.parallel.dist import world_size
from npu_rl.parallel.unshard import PlainView, UnshardStats, is_sharded, unsharded
from npu_rl.protocol import Batch
from npu_rl.rollout.base import Generation, SamplingParams, TokenCompletion, TokenGeneration
from npu_rl.rollout.utils import (assemble_rollout_batch, check_token_requests, device_memory_used_gb,
                                 first_stop_response_mask, left_padded_prompts)
from npu_rl.rollout.weights import SyncStats, VersionGate, bucketed, flatten
from npu_rl.models.loader import load_causal_lm
from npu_rl.models.lora import has_lora_layers, hf_model

logger = logging.getLogger(__name__)


def warp_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature, then top-k (``<= 0``: off), then top-p (``>= 1``: off); filtered tokens get -inf. [N, V]"""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    vocab_size = logits.shape[-1]
    if 0 < top_k < vocab_size:
        kth_largest = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1)  # ascending
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= 1.0 - top_p
        remove_sorted[..., -1] = False  # always keep the most likely token
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits



def _no_router_loss(module) -> dict:
    """An MoE model whose config asks for router logits (``output_router_logits=True``: the auxiliary loss in training)
    computes transformers' load-balancing loss in every forward, decoding included, where it fails: each decode step
    routes one token per row against the whole attention mask (found on the H200 with Qwen3-MoE, transformers 5.17).
    Generation needs no loss; the experts are recorded by the router hooks."""
    config = getattr(module, "config", None)
    return {"output_router_logits": False} if getattr(config, "output_router_logits", False) else {}

def vision_token_ids(module) -> list[int]:
    """A Qwen-VL module's vision placeholder ids, banned from responses (``placeholder_token_ids``). [] for text."""
    return placeholder_token_ids(getattr(module, "config", None))


def _sample_rows(prompts: Batch, n: int) -> list:
    """The prompts' ``multi_modal_inputs`` repeated ``n`` times, as ``generate``'s rows: each sample keeps its
    prompt's dict (one object)."""
    return [row for row in prompts.non_tensors.get(MULTI_MODAL_KEY, []) for _ in range(n)]


def _image_token_id(module) -> int | None:
    """The ``<|image_pad|>`` id of a Qwen-VL module (its config's ``image_token_id``); None for a text model."""
    config = getattr(module, "config", None)
    return getattr(config, "image_token_id", None) if getattr(config, "vision_config", None) is not None else None


class SamplingProcessor(LogitsProcessor):
    """Applies the configured warping and records the chosen tokens' log-probs (see the module docstring)."""

    def __init__(self, sampling: SamplingParams, record_logprobs: bool, banned_token_ids: Sequence[int] = ()):
        self.sampling = sampling
        self.record_logprobs = record_logprobs
        self.banned_token_ids = list(banned_token_ids)  # never sampled (a Qwen-VL model's vision placeholders)
        self._previous: torch.Tensor | None = None  # [N, V] log-probs of the last step
        self._chosen: list[torch.Tensor] = []  # [N] per step

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        s = self.sampling
        if self.banned_token_ids:
            scores = scores.float().index_fill(-1, torch.as_tensor(self.banned_token_ids, device=scores.device),
                                               float("-inf"))
        scores = scores.float() if s.greedy else warp_logits(scores, s.temperature, s.top_k, s.top_p)
        if self.record_logprobs:
            if self._previous is not None:  # input_ids[:, -1] is the token drawn from the previous step
                self._chosen.append(self._previous.gather(-1, input_ids[:, -1:]).squeeze(-1))
            self._previous = torch.log_softmax(scores, dim=-1)
        return scores

    def finish(self, generated: torch.Tensor) -> torch.Tensor | None:
        """[N, T] log-probs of ``generated`` (the new tokens, [N, T])."""
        if not self.record_logprobs or generated.shape[1] == 0:
            return None
        assert self._previous is not None and len(self._chosen) == generated.shape[1] - 1
        self._chosen.append(self._previous.gather(-1, generated[:, -1:]).squeeze(-1))
        logprobs = torch.stack(self._chosen, dim=1)
        self._previous, self._chosen = None, []
        return logprobs


class StopWhenAsked(StoppingCriteria):
    """Ends every row after the current decode step once ``should_stop()`` is true (an interrupt at a weight push:
    the rows keep the tokens so far, :mod:`npu_rl.rollout.partial`)."""

    def __init__(self, should_stop: Callable[[], bool]):
        self.should_stop = should_stop

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), bool(self.should_stop()), dtype=torch.bool, device=input_ids.device)


class HFRolloutEngine:
    """transformers ``generate`` behind the :class:`~npu_rl.rollout.base.RolloutEngine` protocol."""

    def __init__(self, module: torch.nn.Module, pad_token_id: int, *, shares_actor_module: bool = True,
                 generate_kwargs: dict[str, Any] | None = None, sleep_level: int = 1,
                 bucket_megabytes: float = 512, gather_full_weights: bool = True, compiled_decode: bool = False,
                 record_routing: bool = False):
        if pad_token_id is None:
            raise ValueError("HFRolloutEngine needs a pad token id (load the tokenizer with load_tokenizer)")
        self.module = module
        self.pad_token_id = int(pad_token_id)
        self.shares_actor_module = shares_actor_module
        self.needs_weight_sync = not shares_actor_module
        self.generate_kwargs = dict(generate_kwargs or {})
        self.sleep_level = sleep_level
        self.bucket_megabytes = bucket_megabytes
        self.gather_full_weights = gather_full_weights
        self.compiled_decode = compiled_decode
        # a Qwen-VL module: each prompt's images are encoded once, not once per sample (``_image_inputs``)
        self.encode_images_once = True
        # rollout.enable_rollout_routing_replay: each row's experts ([B*n, P+R, L, K], ``routed_experts``) for
        # router replay (npu_rl/models/moe.py); hooks on the routers, so the decoding stays eager
        self.record_routing = record_routing
        self._plain_view: PlainView | None = None  # built on the first generate on a sharded module
        self._gate = VersionGate()
        self._asleep = False
        self._offloaded_from: torch.device | None = None

    @classmethod
    def from_pretrained(cls, model_path: str, pad_token_id: int, dtype: str | torch.dtype = "fp32",
                        device: torch.device | str | None = None, **kwargs) -> HFRolloutEngine:
        """An engine with its own copy of the model (``update_weights`` copies into it)."""
        module = load_causal_lm(model_path, dtype=dtype, device=device or get_backend().device())
        return cls(module, pad_token_id, shares_actor_module=False, **kwargs)

    # ------------------------------------------------------------------ generation
    def _device(self) -> torch.device:
        for param in self.module.parameters():
            return param.device
        return get_backend().device()

    def _compiles(self, module: torch.nn.Module) -> bool:
        """Whether this generate decodes with the static cache and a compiled forward (module docstring)."""
        if not self.compiled_decode or self.record_routing or "cache_implementation" in self.generate_kwargs:
            return False

        # FSDP2's per-layer hooks are not traced; PEFT's adapter layers and Qwen-VL models under compile are not
        # verified
        return not (is_sharded(module) or has_lora_layers(module) or _image_token_id(module) is not None)

    def _generation_config(self, sampling: SamplingParams, compiled: bool = False) -> GenerationConfig:
        # Every sampling knob is set explicitly (neutral where SamplingProcessor does the work), so that nothing
        # is filled in from the model folder's generation_config.json.
        neutral_warpers = {} if sampling.greedy else dict(  # (greedy: transformers applies no warper anyway)
            temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0)
        config = GenerationConfig(
            do_sample=not sampling.greedy, num_beams=1, max_new_tokens=sampling.max_new_tokens, min_new_tokens=0,
            repetition_penalty=1.0, no_repeat_ngram_size=0, renormalize_logits=False, use_cache=True,
            eos_token_id=list(sampling.stop_token_ids), pad_token_id=self.pad_token_id,
            return_dict_in_generate=False, **neutral_warpers,
        )
        if compiled:
            config.cache_implementation = "static"  # transformers then compiles the forward (module docstring)
        config.update(**self.generate_kwargs)
        return config

    @torch.no_grad()
    def generate(self, prompts: Batch, sampling: SamplingParams,
                 should_stop: Callable[[], bool] | None = None) -> Generation:
        if self._asleep:
            raise RuntimeError("the hf rollout engine is asleep: call wake_up() before generate()")
        n, response_length = sampling.n, sampling.max_new_tokens
        device = self._device()
        input_ids = prompts["input_ids"].repeat_interleave(n, dim=0).to(device)
        attention_mask = prompts["attention_mask"].repeat_interleave(n, dim=0).to(device)
        processor = SamplingProcessor(sampling, record_logprobs=sampling.return_logprobs,
                                      banned_token_ids=vision_token_ids(self.module))
        was_training = self.module.training
        self.module.eval()  # no dropout; gradient checkpointing (training only) would disable the KV cache
        gather = unsharded(self.module) if self.gather_full_weights else nullcontext(UnshardStats())
        try:
            with gather as unshard_stats:
                # Decoding on FSDP shards all-gathers every layer at every token, so all ranks must run the same
                # number of forward passes; with the full weights gathered once, each rank decodes on its own,
                # on a hook-free twin of the module that aliases the gathered tensors.
                synced = (self.shares_actor_module and world_size() > 1 and not unshard_stats.gathered)
                module = self.module
                if unshard_stats.gathered:
                    if self._plain_view is None:
                        self._plain_view = PlainView(self.module)
                    module = self._plain_view.bind(self.module)
                compiled = self._compiles(module)
                image_inputs = self._image_inputs(module, prompts, n, input_ids, device)
                # pixels repeated per sample: the prefill's tower call computes each prompt's images once
                pixel_rows = _sample_rows(prompts, n) if "pixel_values" in image_inputs else None
                routing = GenerationRouting(module) if self.record_routing else None
                decode_start = time.perf_counter()
                try:
                    with vision_dedup(module, pixel_rows):
                        sequences = module.generate(
                            input_ids=input_ids, attention_mask=attention_mask,
                            generation_config=self._generation_config(sampling, compiled),
                            logits_processor=LogitsProcessorList([processor]), synced_gpus=synced,
                            stopping_criteria=StoppingCriteriaList([StopWhenAsked(should_stop)] if should_stop
                                                                   else []),
                            **_no_router_loss(module), **image_inputs,
                        )
                    decode_s = time.perf_counter() - decode_start  # generate returns tokens: synchronised
                finally:
                    if routing is not None:
                        routing.remove()
                    if module is not self.module:
                        self._plain_view.release()
        finally:
            self.module.train(was_training)
        generated = sequences[:, input_ids.shape[1]:]
        num_rows, num_generated = generated.shape
        # Decoding is host-bound for small models (one Python pass over the layers per token): the time per decoded
        # step and the host threads torch uses here tell a slow rollout apart from a slow dispatch around it.
        metrics = unshard_stats.as_metrics("rollout") | {
            "timing_s/rollout_decode": decode_s,
            "rollout/decode_ms_per_step": 1000 * decode_s / max(num_generated, 1),
            "rollout/host_threads": float(torch.get_num_threads()),
            "rollout/decode_compiled": float(compiled),
        }
        if num_generated > response_length:
            raise RuntimeError(f"generate returned {num_generated} new tokens for max_new_tokens={response_length}")
        responses = generated.new_full((num_rows, response_length), self.pad_token_id)
        responses[:, :num_generated] = generated
        lengths = torch.full((num_rows,), num_generated, device=generated.device)
        response_mask = first_stop_response_mask(responses, sampling.stop_token_ids, lengths)
        logprobs = processor.finish(generated)
        if logprobs is not None:
            logprobs = torch.nn.functional.pad(logprobs, (0, response_length - num_generated))
        elif sampling.return_logprobs:  # nothing generated (max_new_tokens=0)
            logprobs = torch.zeros(num_rows, response_length, device=generated.device)
        out_prompts = prompts.to(device) if prompts["input_ids"].device != device else prompts
        batch = assemble_rollout_batch(out_prompts, responses, response_mask, n, self.pad_token_id, logprobs)
        if routing is not None:
            prompt_width = input_ids.shape[1]
            batch["routed_experts"] = routing.routed_experts(num_rows, prompt_width, prompt_width + response_length)
        return Generation(batch, metrics)

    def _image_inputs(self, module: torch.nn.Module, prompts: Batch, n: int, input_ids: torch.Tensor, device
                      ) -> dict[str, Any]:
        """``generate``'s image arguments for the prompts' rows repeated ``n`` times (module docstring); {} for text.
        Each prompt's images are encoded once (one tower call over the batch's distinct prompts) and its ``n``
        samples share the features, where ``module`` takes them (:func:`takes_encoder_outputs`) and carries no FSDP
        hooks (every rank would have to call the tower alike); else the pixels go to ``generate`` repeated."""
        rows = prompts.non_tensors.get(MULTI_MODAL_KEY)
        if rows is None or not any(bool(row) for row in rows):
            return {}
        image_token_id = _image_token_id(self.module)
        if image_token_id is None:
            raise ValueError(f"the prompts carry images but the rollout module ({type(self.module).__name__}) is not "
                             "a Qwen-VL model")
        dtype = next(self.module.parameters()).dtype
        sample_rows = _sample_rows(prompts, n)
        features = (encode_images(module, rows, device, dtype)
                    if self.encode_images_once and not is_sharded(module) else None)
        if features is not None:
            # the grids still go in: transformers computes the prefill's 3-D rotary ids from them
            inputs = {"image_grid_thw": multi_modal_kwargs(sample_rows, device)["image_grid_thw"],
                      **features.model_inputs(sample_rows)}
        else:
            inputs = multi_modal_kwargs(sample_rows, device, dtype)
        rope_index = getattr(getattr(hf_model(self.module), "model", None), "get_rope_index", None)  # under PEFT too
        if rope_index is not None and "mm_token_type_ids" in inspect.signature(rope_index).parameters:
            # transformers >= 5.19 finds the image tokens from these; earlier versions from the ids themselves
            inputs["mm_token_type_ids"] = (input_ids == image_token_id).int()
        return inputs

    def generate_token_lists(self, token_lists: Sequence[Sequence[int]], max_tokens: Sequence[int],
                             sampling: SamplingParams) -> TokenGeneration:
        """The requests left-padded into one batch and generated to the largest budget; each continuation is then
        cut to its own budget (and at its first stop id, as ``generate`` masks)."""
        check_token_requests(token_lists, max_tokens)
        if not token_lists:
            return TokenGeneration([])
        budget = max(1, max(int(m) for m in max_tokens))
        out = self.generate(left_padded_prompts(token_lists, self.pad_token_id),
                            replace(sampling, n=1, max_new_tokens=budget))
        responses, mask = out.batch["responses"].cpu(), out.batch["response_mask"].cpu().bool()
        logprobs = out.batch["rollout_logprobs"].cpu() if "rollout_logprobs" in out.batch.tensors else None
        completions = []
        for row, limit in enumerate(max_tokens):
            ids = responses[row][mask[row]].tolist()[: int(limit)]
            completions.append(TokenCompletion(ids, logprobs[row][: len(ids)].tolist() if logprobs is not None
                                               else None))
        return TokenGeneration(completions, out.metrics)

    # ------------------------------------------------------------------ weights
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]],
                       version: int | None = None) -> dict[str, float]:
        """No-op when the engine shares the actor's module; else copy the tensors into the engine's copy."""
        if self.shares_actor_module or self._gate.is_current(version):
            return {}
        start = time.perf_counter()
        targets = dict(self.module.named_parameters(remove_duplicate=False))
        targets.update(dict(self.module.named_buffers(remove_duplicate=False)))
        stats = SyncStats()
        loaded: set[str] = set()
        with torch.no_grad():
            for name, tensor in flatten(bucketed(named_tensors, self.bucket_megabytes, stats)):
                target = targets.get(name)
                if target is None:
                    close = difflib.get_close_matches(name, list(targets), n=3)
                    raise KeyError(f"update_weights: {name!r} is not a parameter of the rollout model"
                                   + (f"; close names: {close}" if close else ""))
                if target.shape != tensor.shape:
                    raise ValueError(f"update_weights: {name!r} has shape {tuple(tensor.shape)}, the rollout model "
                                     f"expects {tuple(target.shape)}")
                target.copy_(tensor)
                loaded.add(name)
        if not loaded:
            raise ValueError("update_weights received no tensors")
        missing = set(dict(self.module.named_parameters())) - loaded
        if missing:
            logger.warning("update_weights: %d parameters were not updated, e.g. %s", len(missing),
                           sorted(missing)[:3])
        self._gate.mark(version)
        return stats.as_metrics(time.perf_counter() - start)

    # ------------------------------------------------------------------ memory
    def sleep(self, level: int | None = None) -> dict[str, float]:
        """Release the generation caches; an engine with its own copy also moves it to host memory."""
        if self._asleep:
            return {}
        backend = get_backend()
        start, before = time.perf_counter(), device_memory_used_gb()
        if not self.shares_actor_module and backend.is_accelerator:
            self._offloaded_from = self._device()
            self.module.to("cpu")
        backend.synchronize()
        backend.empty_cache()
        self._asleep = True
        after = device_memory_used_gb()
        return {"timing_s/rollout_sleep": time.perf_counter() - start, "rollout/sleep_mem_used_before_gb": before,
                "rollout/sleep_mem_used_after_gb": after, "rollout/sleep_mem_freed_gb": before - after}

    def wake_up(self) -> dict[str, float]:
        if not self._asleep:
            return {}
        start = time.perf_counter()
        if self._offloaded_from is not None:
            self.module.to(self._offloaded_from)
            self._offloaded_from = None
        self._asleep = False
        return {"timing_s/rollout_wake": time.perf_counter() - start,
                "rollout/wake_mem_used_after_gb": device_memory_used_gb()}

    def reset_prefix_cache(self) -> None:
        """Hugging Face ``generate`` keeps no prefix cache between calls."""
