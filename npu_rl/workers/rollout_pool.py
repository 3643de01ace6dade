"""The rollout role of the asynchronous trainers: an engine with its own weights on the rollout pool's devices.

Each rollout rank holds one engine (``hf`` with its own copy of the model, or ``vllm``), joins the weight group
with the trainer's rank 0 (:mod:`npu_rl.parallel.weight_transport`), and stamps every row it generates with the
policy versions its tokens came from, as verl's ``min/max_global_steps`` (param_version start/end):
``policy_version`` [rows] int64, the version its first token was sampled under, and ``policy_version_end``, the
version of its last token; they differ only for a partial rollout continued after a push. The trainer measures
staleness from them.

Partial rollouts (``async_training.partial_rollout``): a call given ``interrupt_after`` stops early once the
trainer raises the push signal (:class:`~npu_rl.parallel.weight_transport.PushSignal`); each row then says whether
it is ``unfinished`` [rows] bool, and :meth:`RolloutPoolWorker.continue_sequences` continues such rows later, on the
weights held then (:mod:`npu_rl.rollout.partial`).
"""

from __future__ import annotations

import time

import torch

from npu_rl.agent.rollout import AgentRollout, agent_rollout_enabled
from npu_rl.agent.loops import SINGLE_TURN_LOOP
from npu_rl.agent.runner import row_agent_names
from npu_rl.config.derived import RunSettings
from npu_rl.config.schema import ModelConfig, RolloutConfig
from npu_rl.controller.dispatch import Dispatch, register
from npu_rl.models.loader import load_tokenizer, stop_token_ids
from npu_rl.parallel.dist import rank
from npu_rl.parallel.weight_transport import PushSignal, WeightGroup, join_weight_group, receive_weights
from npu_rl.protocol import Batch, WorkerOutput
from npu_rl.rollout.factory import build_rollout_engine, sampling_params_from_config
from npu_rl.rollout.partial import continue_rows, response_lengths, unfinished_rows
from npu_rl.workers.memory import ReportsMemory
from npu_rl.device import get_backend


class RolloutPoolWorker(ReportsMemory):
    """``group.rollout`` of the rollout pool: generate, and take weights pushed by the trainer."""

    def __init__(self, model_cfg: ModelConfig, rollout_cfg: RolloutConfig, run_settings: RunSettings):
        self.model_cfg = model_cfg
        self.rollout_cfg = rollout_cfg
        self.run_settings = run_settings
        self.engine = None
        self.weights: WeightGroup | None = None
        self.push_signal: PushSignal | None = None
        self.policy_version = 0  # the version of the weights the engine holds (0: the model's own)

    @register(Dispatch.ALL)
    def init_model(self) -> None:
        cfg = self.model_cfg
        self.tokenizer = load_tokenizer(cfg.path, cfg.trust_remote_code, cfg.custom_chat_template)
        self.stop_ids = stop_token_ids(self.tokenizer, cfg.path)
        self.engine = build_rollout_engine(self.rollout_cfg, cfg.path, None, self.tokenizer,
                                           allow_compile=self.run_settings.allow_compile)
        # hf sampling draws from this process's generators, which nothing else seeds: trainer.seed (+ the pool rank,
        # so ranks differ), as the synchronous trainer seeds the process its colocated engine samples in; two runs
        # with one seed then sample the same tokens. vLLM seeds its own engine (rollout.seed), in both trainers.
        get_backend().manual_seed(self.run_settings.seed + rank())
        self.agent = None  # rollout.mode=async / multi_turn: the same agent loops as the colocated worker
        if agent_rollout_enabled(self.rollout_cfg):
            self.agent = AgentRollout(self.rollout_cfg, self.tokenizer, self.stop_ids,
                                      self.run_settings.max_response_length,
                                      chat_kwargs=self.run_settings.chat_template_kwargs)

    @register(Dispatch.ALL, blocking=False)
    def join_weight_group(self, backend: str, host: str, port: int, world_size: int) -> None:
        """Rollout rank r is rank r + 1 of the weight group (rank 0 is the trainer's rank 0)."""
        device = get_backend().device() if backend != "gloo" else torch.device("cpu")
        self.weights = join_weight_group(backend, host, port, rank() + 1, world_size, device)

    @register(Dispatch.ALL, blocking=False)
    def receive_weights(self, version: int) -> dict[str, float]:
        """Take the weights the trainer's rank 0 is sending now; the engine then holds ``version``."""
        if self.weights is None:
            raise RuntimeError("receive_weights before join_weight_group")
        start = time.perf_counter()
        metrics = self.engine.update_weights(receive_weights(self.weights), version=None)
        self.policy_version = int(version)
        return metrics | {"timing_s/rollout_receive_weights": time.perf_counter() - start}

    @register(Dispatch.ALL)
    def connect_push_signal(self, host: str, port: int) -> None:
        """Partial rollouts: read the trainer's push signal between decode steps."""
        self.push_signal = PushSignal(host, port, is_master=False)

    def _should_stop(self, interrupt_after: int | None):
        if interrupt_after is None:
            return None
        if self.push_signal is None:
            raise RuntimeError("generate_sequences(interrupt_after=...) before connect_push_signal")
        return lambda: self.push_signal.raised_since(interrupt_after)

    def _runs_agent_loops(self, prompts: Batch, partial: bool) -> bool:
        """Whether this call goes through the agent loops. With partial rollouts, single-turn rows (verl's fully-async
        scripts set rollout.mode=async for them) are a plain generation, the same tokens as the single-turn loop's,
        so that a push can interrupt them; validation refuses partial rollouts with any other loop."""
        if self.agent is None:
            return False
        if not partial:
            return True
        loops = set(row_agent_names(prompts, str(self.rollout_cfg.agent.default_agent_loop)))
        if self.rollout_cfg.multi_turn.enable or loops != {SINGLE_TURN_LOOP}:
            raise NotImplementedError(f"partial rollouts with the agent loop(s) {', '.join(sorted(loops))} are not "
                                      "built (only single-turn rows can be interrupted at a push)")
        return False

    def _training_sampling(self, validate: bool = False):
        return sampling_params_from_config(self.rollout_cfg, validate, self.run_settings.max_response_length,
                                           self.stop_ids, logprobs=self.run_settings.rollout_logprobs and not validate)

    @register(Dispatch.DP_SPLIT)
    def generate_sequences(self, prompts: Batch, validate: bool = False,
                           interrupt_after: int | None = None) -> WorkerOutput:
        """``rollout.n`` responses per prompt with the pool's weights, each row stamped with its versions.
        ``interrupt_after``: the push signal's count when the trainer started this call; the call returns early once
        the signal is raised past it, and every row says whether it is ``unfinished``."""
        sampling = self._training_sampling(validate)
        should_stop = self._should_stop(interrupt_after)
        start = time.perf_counter()
        if self._runs_agent_loops(prompts, partial=should_stop is not None):
            generated = self.agent.generate(self.engine, prompts, sampling)
        elif should_stop is not None:
            generated = self.engine.generate(prompts, sampling, should_stop=should_stop)
        else:
            generated = self.engine.generate(prompts, sampling)
        batch = generated.batch.to("cpu")
        versions = torch.full((len(batch),), self.policy_version, dtype=torch.int64)
        stamps = {"policy_version": versions, "policy_version_end": versions.clone()}
        if should_stop is not None:
            stamps["unfinished"] = unfinished_rows(batch, sampling.stop_token_ids)
        batch = batch.union(Batch(stamps))
        return WorkerOutput(batch, generated.metrics | {"timing_s/generate_sequences": time.perf_counter() - start})

    @register(Dispatch.DP_SPLIT)
    def continue_sequences(self, rows: Batch, interrupt_after: int) -> WorkerOutput:
        """Partial rollouts: continue unfinished ``rows`` from the tokens they hold, on the weights held now (prompt +
        those tokens as the context, the rest of the response width as the budget); the new tokens' log-probs are
        those of these weights. ``policy_version_end`` becomes the current version; ``policy_version`` is kept."""
        sampling = self._training_sampling()
        should_stop = self._should_stop(interrupt_after)
        start = time.perf_counter()
        held = int(response_lengths(rows).sum())
        metrics: dict[str, float] = {}

        def generate(prompts: Batch, params) -> Batch:
            generated = self.engine.generate(prompts, params, should_stop=should_stop)
            metrics.update(generated.metrics)
            return generated.batch.to("cpu")

        batch = continue_rows(generate, rows, sampling, self.tokenizer.pad_token_id)
        batch["policy_version_end"] = torch.full((len(batch),), self.policy_version, dtype=torch.int64)
        batch["unfinished"] = unfinished_rows(batch, sampling.stop_token_ids)
        return WorkerOutput(batch, metrics | {"timing_s/continue_sequences": time.perf_counter() - start,
                                              "rollout/partial_tokens_kept": float(held)})

    @register(Dispatch.DP_SPLIT, blocking=False)
    def generate_ahead(self, prompts: Batch) -> WorkerOutput:
        """``generate_sequences`` returning at once (a ``Pending``): the trainer works while the pool generates."""
        return self.generate_sequences(prompts)
