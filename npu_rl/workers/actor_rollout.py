"""The hybrid engine: the actor and its rollout engine on the same devices, composed (not fused) in one worker.

Before each generation: wake the engine, stream the actor's weights into it if they changed since the last sync
(layer by layer from the FSDP2 shards), generate, then put the engine to sleep so the update has the memory.
The timings and memory figures of those phases come back as the output's metrics.
"""

from __future__ import annotations

import time

from npu_rl.agent.rollout import AgentRollout, agent_rollout_enabled
from npu_rl.config.derived import RunSettings
from npu_rl.config.schema import ActorConfig, ModelConfig, RolloutConfig
from npu_rl.controller.dispatch import Dispatch, register
from npu_rl.models.loader import load_tokenizer, stop_token_ids
from npu_rl.models.lora import export_merged_folder, has_lora_output_layer
from npu_rl.parallel.dist import rank
from npu_rl.parallel.weight_transport import join_weight_group, send_weights
from npu_rl.parallel.weights import export_hf_folder
from npu_rl.protocol import Batch, WorkerOutput
from npu_rl.rollout.factory import build_rollout_engine, sampling_params_from_config
from npu_rl.workers.actor import ActorWorker
from npu_rl.workers.memory import ReportsMemory
from npu_rl.workers.model_runner import MicroBatching


class ActorRolloutWorker(ReportsMemory):
    """One role for the driver (``group.actor_rollout``), two parts inside: ``self.actor`` and ``self.engine``."""

    def __init__(self, model_cfg: ModelConfig, actor_cfg: ActorConfig, rollout_cfg: RolloutConfig,
                 run_settings: RunSettings):
        self.model_cfg = model_cfg
        self.rollout_cfg = rollout_cfg
        self.run_settings = run_settings
        logprob_micro = MicroBatching(run_settings.micro_batches.actor_logprob,
                                      rollout_cfg.log_prob_use_dynamic_bsz, rollout_cfg.log_prob_max_token_len_per_gpu)
        self.actor = ActorWorker(model_cfg, actor_cfg, logprob_micro, run_settings)
        self.engine = None
        self.weights_version = 0  # bumped by every policy update; the engine syncs when it lags behind

    @register(Dispatch.ALL)
    def init_model(self, total_training_steps: int) -> None:
        self.actor.init_model(total_training_steps)
        self._check_lora_rollout()
        model_cfg = self.model_cfg
        self.tokenizer = load_tokenizer(model_cfg.path, model_cfg.trust_remote_code, model_cfg.custom_chat_template)
        self.stop_ids = stop_token_ids(self.tokenizer, model_cfg.path)
        # lora.merge (verl's key): the engine runs without LoRA and _sync_weights streams W + scale * B @ A
        rollout_lora_rank = 0 if model_cfg.lora.merge else model_cfg.lora_rank
        self.engine = build_rollout_engine(self.rollout_cfg, model_cfg.path, self.actor.generation_module,
                                           self.tokenizer, lora_rank=rollout_lora_rank,
                                           allow_compile=self.run_settings.allow_compile,
                                           decode_steps=total_training_steps * self.run_settings.max_response_length)
        self.agent = None  # agent loops (rollout.mode=async or multi_turn.enable): npu_rl/agent/
        if agent_rollout_enabled(self.rollout_cfg):
            self.agent = AgentRollout(self.rollout_cfg, self.tokenizer, self.stop_ids,
                                      self.run_settings.max_response_length,
                                      chat_kwargs=self.run_settings.chat_template_kwargs)
        if self.rollout_cfg.free_cache_engine:
            self.engine.sleep()

    @register(Dispatch.RANK0)
    def model_config(self):
        return self.actor.model.config

    def dispatch_layout(self):
        return self.actor.dispatch_layout()

    @register(Dispatch.DP_SPLIT)
    def generate_sequences(self, prompts: Batch, validate: bool = False, greedy: bool = False) -> WorkerOutput:
        """Responses for ``prompts`` (``rollout.n`` samples each; one greedy sample with ``greedy``, ReMax's
        baseline), and the phases' timings and memory figures."""
        rollout_cfg = self.rollout_cfg
        sampling = sampling_params_from_config(rollout_cfg, validate, self.run_settings.max_response_length,
                                               self.stop_ids,
                                               logprobs=self.run_settings.rollout_logprobs and not validate)
        if greedy:
            sampling.n, sampling.do_sample, sampling.temperature, sampling.return_logprobs = 1, False, 0.0, False
        metrics: dict[str, float] = {}
        if rollout_cfg.free_cache_engine:
            metrics |= self.engine.wake_up()
        if self.engine.needs_weight_sync:
            metrics |= self._sync_weights()
        start = time.perf_counter()
        generated = (self.agent.generate(self.engine, prompts, sampling) if self.agent is not None
                     else self.engine.generate(prompts, sampling))
        out = generated.batch.to("cpu")  # the driver keeps batches in host memory
        metrics |= generated.metrics
        metrics["timing_s/generate_sequences"] = time.perf_counter() - start
        if rollout_cfg.free_cache_engine:
            metrics |= self.engine.sleep()
        return WorkerOutput(out, metrics)

    def _check_lora_rollout(self) -> None:
        model = self.actor.model
        if (self.actor.is_lora and str(self.rollout_cfg.name).lower() == "vllm" and has_lora_output_layer(model)
                and getattr(model.config, "tie_word_embeddings", False)):
            raise ValueError("actor_rollout_ref.model.target_modules adapts lm_head, whose weight this model ties to "
                             "the input embeddings: the vllm rollout cannot take that adapter (it would change the "
                             "embeddings too). Leave lm_head out of target_modules, or use rollout.name=hf")

    def _sync_weights(self) -> dict[str, float]:
        """The policy into the engine: full weights; with LoRA and an engine that takes adapters, the base once
        (when the engine has none yet) and then the adapter alone after each update; with LoRA and an engine that
        does not (or ``model.lora.merge``, which starts vLLM without LoRA), the merged weights."""
        if self.actor.is_lora and getattr(self.engine, "takes_lora_tensors", False):
            metrics = {}
            fresh_base = not self.engine.has_weights  # dummy start, or weights discarded by sleep level 2
            if fresh_base:
                metrics |= self.engine.update_weights(self.actor.named_base_weights(), version=None)
            elif self.engine.adapter_is_current(self.weights_version):
                return {"rollout/update_adapter_skipped": 1.0}  # no gather: nothing changed since the last sync
            tensors, config = self.actor.adapter_for_rollout()
            version = None if fresh_base else self.weights_version  # None: load even if the version matches
            return metrics | self.engine.update_adapter(tensors, config, version=version)
        return self.engine.update_weights(self.actor.named_full_weights(), version=self.weights_version)

    # ----------------------------------------------------------------- a separate rollout pool (docs/async.md)
    @register(Dispatch.ALL)
    def join_weight_group(self, backend: str, host: str, port: int, world_size: int) -> None:
        """Rank 0 joins the group spanning it and the rollout ranks (it hosts the store at ``host:port``)."""
        self.weight_group = None
        if rank() == 0:
            device = self.actor.engine.device if backend != "gloo" else "cpu"
            self.weight_group = join_weight_group(backend, host, port, 0, world_size, device)

    @register(Dispatch.ALL)
    def send_weights(self) -> dict[str, float]:
        """The current policy to the rollout pool, in buckets (the gather is collective over the trainer ranks;
        rank 0 sends). Returns ``weight_sync/*`` metrics on rank 0."""
        tensors = self.actor.named_full_weights()
        if self.weight_group is None:  # ranks > 0 take part in the gather only
            for _ in tensors:
                pass
            return {}
        return send_weights(self.weight_group, tensors, self.rollout_cfg.update_weights_bucket_megabytes)

    @register(Dispatch.DP_SPLIT)
    def compute_logprobs(self, batch: Batch) -> Batch:
        return self.actor.compute_logprobs(batch)

    @register(Dispatch.DP_SPLIT)
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        """The reference role when the actor trains a LoRA adapter: the same model with the adapter off."""
        return self.actor.compute_ref_logprobs(batch)

    @register(Dispatch.DP_SPLIT)
    def update_policy(self, batch: Batch) -> WorkerOutput:
        out = self.actor.update_policy(batch)
        self.weights_version += 1
        return out

    @register(Dispatch.ALL)
    def save_checkpoint(self, path: str) -> None:
        self.actor.save_checkpoint(path, self.tokenizer)

    @register(Dispatch.ALL)
    def load_checkpoint(self, path: str) -> None:
        self.actor.load_checkpoint(path)
        self.weights_version += 1  # the engine must take the loaded weights

    @register(Dispatch.ALL)
    def export_hf(self, path: str) -> None:
        """The current policy as a plain Hugging Face folder (model + tokenizer), gathered from shards. Collective."""
        if self.actor.is_lora:  # the adapter merged into the base weights

            export_merged_folder(self.actor.model, path, tokenizer=self.tokenizer)
            return
        export_hf_folder(self.actor.model, path, tokenizer=self.tokenizer)

