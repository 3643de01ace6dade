"""The rollout role of the asynchronous trainers: an engine with its own weights on the rollout pool's devices.

Each rollout rank holds one engine (``hf`` with its own copy of the model, or ``vllm``), joins the weight group
with the trainer's rank 0 (:mod:`npu_rl.parallel.weight_transport`), and stamps every row it generates with the
policy version its weights came from (``policy_version`` [rows], int64): the trainer measures staleness from it.
"""

from __future__ import annotations

import time

import torch

from npu_rl.agent.rollout import AgentRollout, agent_rollout_enabled
from npu_rl.config.derived import RunPlan
from npu_rl.config.schema import ModelConfig, RolloutConfig
from npu_rl.controller.dispatch import Dispatch, register
from npu_rl.models.loader import load_tokenizer, stop_token_ids
from npu_rl.parallel.dist import rank
from npu_rl.parallel.weight_transport import WeightGroup, join_weight_group, receive_weights
from npu_rl.protocol import Batch, WorkerOutput
from npu_rl.rollout.factory import build_rollout_engine, sampling_params_from_config
from npu_rl.workers.memory import ReportsMemory


class RolloutPoolWorker(ReportsMemory):
    """``group.rollout`` of the rollout pool: generate, and take weights pushed by the trainer."""

    def __init__(self, model_cfg: ModelConfig, rollout_cfg: RolloutConfig, plan: RunPlan):
        self.model_cfg = model_cfg
        self.rollout_cfg = rollout_cfg
        self.plan = plan
        self.engine = None
        self.weights: WeightGroup | None = None
        self.policy_version = 0  # the version of the weights the engine holds (0: the model's own)

    @register(Dispatch.ALL)
    def init_model(self) -> None:
        cfg = self.model_cfg
        self.tokenizer = load_tokenizer(cfg.path, cfg.trust_remote_code, cfg.custom_chat_template)
        self.stop_ids = stop_token_ids(self.tokenizer, cfg.path)
        self.engine = build_rollout_engine(self.rollout_cfg, cfg.path, None, self.tokenizer,
                                           allow_compile=self.plan.allow_compile)
        self.agent = None  # rollout.mode=async / multi_turn: the same agent loops as the colocated worker
        if agent_rollout_enabled(self.rollout_cfg):
            self.agent = AgentRollout(self.rollout_cfg, self.tokenizer, self.stop_ids, self.plan.max_response_length,
                                      chat_kwargs=self.plan.chat_template_kwargs)

    @register(Dispatch.ALL, blocking=False)
    def join_weight_group(self, backend: str, host: str, port: int, world_size: int) -> None:
        """Rollout rank r is rank r + 1 of the weight group (rank 0 is the trainer's rank 0)."""
        from npu_rl.device import get_backend

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

    @register(Dispatch.DP_SPLIT)
    def generate_sequences(self, prompts: Batch, validate: bool = False) -> WorkerOutput:
        """``rollout.n`` responses per prompt with the pool's weights, each row stamped with ``policy_version``."""
        sampling = sampling_params_from_config(self.rollout_cfg, validate, self.plan.max_response_length,
                                               self.stop_ids, logprobs=self.plan.rollout_logprobs and not validate)
        start = time.perf_counter()
        generated = (self.agent.generate(self.engine, prompts, sampling) if self.agent is not None
                     else self.engine.generate(prompts, sampling))
        batch = generated.batch.to("cpu")
        batch = batch.union(Batch({"policy_version": torch.full((len(batch),), self.policy_version,
                                                                dtype=torch.int64)}))
        return WorkerOutput(batch, generated.metrics | {"timing_s/generate_sequences": time.perf_counter() - start})

    @register(Dispatch.DP_SPLIT, blocking=False)
    def generate_ahead(self, prompts: Batch) -> WorkerOutput:
        """``generate_sequences`` returning at once (a ``Pending``): the trainer works while the pool generates."""
        return self.generate_sequences(prompts)
