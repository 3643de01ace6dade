"""The RL loop (PPO / GRPO / DAPO and relatives), driving the workers through a worker group.

One step::

    prompts --repeat n--> rollout (wake, sync weights, generate, sleep) --> responses [+ rollout logprobs]
       --> reward manager --> token-level scores        (DAPO: drop groups whose metric is constant, generate more)
                                                          (PRIME: keep train_batch_size groups, filtered ones first)
       --> actor forward (no grad) --> old logprobs, entropy  (bypass mode: the rollout's logprobs instead)
       --> rollout correction: IS weights, rejection, rollout_corr/* metrics (algorithm.rollout_correction)
       --> reference forward --> ref logprobs             (when a KL term is on)
       --> teacher forward --> teacher logprobs           (on-policy distillation: distillation.enabled; several
                                                          teachers: each row its own, by distillation.teacher_key)
       --> implicit PRM: update on the outcomes, then token scores   (PRIME: reward_model.reward_manager=prime)
       --> critic forward --> values                      (PPO / GAE)
       --> KL in reward (optional; fixed | adaptive controller) --> token-level rewards
       --> advantage estimator (registry) --> advantages, returns
       --> balance batch across DP ranks by token count
       --> critic update; actor update (after critic_warmup steps)
       --> metrics, tracking; validation every test_freq; checkpoint every save_freq

The driver holds no model: every tensor operation on a model happens in a worker (in-process or one Ray actor per
device); the driver only moves ``Batch`` objects and does the cheap [B, T] math (rewards, advantages).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from npu_rl.config.derived import RunSettings
from npu_rl.config.schema import PPOConfig
from npu_rl.core import (
    AdvantageInputs,
    AdvantageOutput,
    as_group_ids,
    compute_advantages,
    kl_in_reward,
    make_kl_controller,
)
from npu_rl.core.prime import group_filter_mask, prime_rloo_advantages, prioritised_keep
from npu_rl.protocol import Batch
from npu_rl.trainer import metrics as M
from npu_rl.trainer.async_rollouts import SyncRollouts
from npu_rl.trainer.checkpoint import CheckpointManager, disk_full_error, load_trainer_state
from npu_rl.trainer.estimator_inputs import estimator_extras
from npu_rl.trainer.rollout_correction import bypass_old_logprobs, correct_batch
from npu_rl.trainer.sampling import PromptStream, filter_groups, score_batch
from npu_rl.trainer.validation import validate
from npu_rl.reward.judge import judge_client, score_with_judge
from npu_rl.trainer.checks.judge import function_takes_judge
from npu_rl.utils.flops import step_flops
from npu_rl.trainer.profiling import StepProfiler
from npu_rl.utils.timer import PhaseTimer
from npu_rl.config.async_schema import streaming_batch_size
from npu_rl.device.memory_report import memory_metrics, process_memory_stats
from npu_rl.models.lora import check_resume_adapter
from npu_rl.parallel.seqlen import balance_batch
from npu_rl.rollout.utils import rollout_probs_diff_metrics
from npu_rl.trainer.interrupt import InterruptGuard, stop_after_interrupt
from npu_rl.trainer.validation import dump_generations
from npu_rl.utils.dtypes import to_dtype

logger = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    pass


def total_training_steps(config: PPOConfig, batches_per_epoch: int) -> int:
    """``trainer.total_training_steps`` when set, else batches per epoch x ``trainer.total_epochs`` (fully async:
    the prompts to generate, ``rollout.total_rollout_steps`` or the epochs', over the prompts per update)."""
    if config.trainer.total_training_steps is not None:
        return config.trainer.total_training_steps
    if config.async_training.mode == "fully_async":
        prompts = config.rollout.total_rollout_steps or \
            batches_per_epoch * (config.data.gen_batch_size or 1) * config.trainer.total_epochs
        return max(1, prompts // streaming_batch_size(config))
    return batches_per_epoch * config.trainer.total_epochs


@dataclass
class Roles:
    """Handles on the workers (``group.actor_rollout`` ...); ``ref`` / ``critic`` are None when not needed."""

    actor_rollout: Any
    ref: Any = None
    critic: Any = None
    reward_model: Any = None  # a model-based reward replaces the rule score (reward_model.enable)
    teacher: Any = None  # on-policy distillation's frozen teachers, behind a TeacherRouter (distillation.enabled)
    judge: Any = None  # a generative reward model (reward_model.enable with a causal LM): scores replace the rule's
    prm: Any = None  # PRIME's implicit process reward model (trained every step; reward_model.reward_manager=prime)
    num_devices: int = 1


class PPOTrainer:
    def __init__(self, config: PPOConfig, run_settings: RunSettings, roles: Roles, prompts: PromptStream, val_loader, reward_fn,
                 val_reward_fn, tracker, backend, model_config, tokenizer=None, rollouts=None):
        self.config = config
        self.run_settings = run_settings
        self.roles = roles
        self.prompts = prompts
        self.val_loader = val_loader
        self.reward_fn = reward_fn
        self.val_reward_fn = val_reward_fn
        self.tracker = tracker
        self.backend = backend
        self.model_config = model_config  # HF config of the actor, for FLOPs
        self.tokenizer = tokenizer  # to write validation samples (trainer.log_val_generations)
        # where each step's rollouts come from: the colocated engine, or a separate pool (trainer/async_rollouts.py)
        self.rollouts = rollouts if rollouts is not None else SyncRollouts(prompts, roles.actor_rollout)
        algo = config.algorithm
        self.kl_ctrl = make_kl_controller(type=algo.kl_ctrl.type, kl_coef=algo.kl_ctrl.kl_coef,
                                          target_kl=algo.kl_ctrl.target_kl, horizon=algo.kl_ctrl.horizon)
        keep = [n for n in (config.trainer.max_actor_ckpt_to_keep, config.trainer.max_critic_ckpt_to_keep) if n]
        # one folder per step holds actor and critic: the smaller of the two limits prunes it
        self.checkpoints = CheckpointManager(config.trainer.default_local_dir, min(keep) if keep else None)
        self.total_steps = total_training_steps(config, prompts.batches_per_epoch)
        self.global_step = 0
        self.consecutive_nan_steps = 0
        self.steps_run = self.steps_skipped = 0  # in this process (a resumed run counts again)
        self.first_nonfinite: str | None = None
        self.last_val_metrics: dict[str, float] = {}
        self.profiler = StepProfiler(config, tracker.run_dir, rank=0, device=backend.name)  # global_profiler keys
        self.judge = judge_client(config.reward_model, roles.judge)
        self.judge_in_reward_fn = self.judge is not None and function_takes_judge(config)
        if self.judge_in_reward_fn:  # the custom function scores, calling the judge itself (verl's GenRM usage)
            for fn in (reward_fn, val_reward_fn):
                if fn is not None:
                    fn.pass_to_score_fn(judge=self.judge)

    # ------------------------------------------------------------------------------------------------- the loop
    def fit(self) -> int:
        """Train to ``total_steps``; returns the process exit code (130 / 143 after SIGINT / SIGTERM: the step in
        progress finishes and is saved, see ``trainer/interrupt.py``)."""
        with InterruptGuard() as self.interrupt:
            return self._fit()

    def _fit(self) -> int:
        self._resume()
        trainer = self.config.trainer
        if self.global_step >= self.total_steps:
            print(f"npu-rl: the checkpoint is at step {self.global_step} and total_training_steps is "
                  f"{self.total_steps}: nothing left to train (raise trainer.total_training_steps or "
                  "trainer.total_epochs to continue)", file=sys.stderr)
            return 0
        if trainer.val_before_train and self.val_reward_fn is not None and self.global_step == 0:
            self._log(self._validate(), self.global_step)
            if trainer.val_only:
                return 0
        progress = _progress_bar(trainer.progress_bar, self.global_step, self.total_steps)
        while self.global_step < self.total_steps and not self.interrupt.requested:
            self.global_step += 1
            step_metrics = self.train_step()
            is_last = self.global_step == self.total_steps
            if trainer.test_freq > 0 and (self.global_step % trainer.test_freq == 0 or is_last):
                step_metrics |= self._validate()
            saved = trainer.save_freq > 0 and (self.global_step % trainer.save_freq == 0 or is_last)
            if saved:
                start = time.perf_counter()
                self.save_checkpoint()
                step_metrics["timing_s/save_checkpoint"] = time.perf_counter() - start
            self._log(step_metrics, self.global_step)
            progress.update(1)
            progress.set_postfix(_postfix(step_metrics, self.last_val_metrics))
            if self.interrupt.requested:
                progress.close()

                return stop_after_interrupt(self, self.interrupt, saved)
        progress.close()
        if self.interrupt.requested:  # during validation before the first step

            return stop_after_interrupt(self, self.interrupt, True)
        return self._all_updates_skipped()

    def train_step(self) -> dict[str, float]:
        timer = PhaseTimer(self.backend.synchronize, around=self.profiler.phase)
        self.backend.reset_peak_memory_stats()  # perf/max_memory_*: this step's peak
        with self.profiler.step(self.global_step), timer("step"):
            batch, gen_metrics = self._generate_and_score(timer)
            batch, experience_metrics = self._make_experience(batch, timer)
            update_metrics = self._update(batch, timer)
            update_metrics |= self.rollouts.after_update()  # an asynchronous mode may push the weights here
        if self.config.trainer.rollout_data_dir and self.tokenizer is not None:  # every rollout, one file per step

            path = os.path.join(self.config.trainer.rollout_data_dir, f"{self.global_step}.jsonl")
            dump_generations(batch, self.tokenizer, path, self.global_step)
        num_tokens = int(batch["attention_mask"].sum())
        metrics: dict[str, Any] = {**gen_metrics, **experience_metrics, **update_metrics}
        metrics |= M.data_metrics(batch, self.run_settings.max_prompt_length, self.run_settings.max_response_length,
                                  self.run_settings.use_critic)
        metrics |= timer.metrics({"gen": int(batch["response_mask"].sum()), "update_actor": num_tokens})
        metrics |= M.throughput_metrics(num_tokens, timer.seconds["step"], self.roles.num_devices)
        metrics |= self._mfu(batch, timer)
        metrics |= self._memory_metrics()
        out = M.to_floats(metrics)
        self._check_nan(out)
        return out

    # ------------------------------------------------------------------------------------------------- phases
    def _generate_and_score(self, timer: PhaseTimer) -> tuple[Batch, dict[str, Any]]:
        """Rollouts with scores; DAPO's dynamic sampling keeps generating until enough groups vary."""
        fg = self.config.algorithm.filter_groups
        train_batch_size = self.config.data.train_batch_size
        kept: list[Batch] = []
        metrics: dict[str, Any] = {}
        num_gen_batches, num_prompts = 0, 0
        while True:
            num_gen_batches += 1
            with timer("gen"):
                prompts, rollout = self.rollouts.next_rollout()
            batch, metrics = rollout.batch, metrics | rollout.metrics
            if self.run_settings.use_greedy_baseline:
                with timer("gen_max"):
                    batch = batch.union(Batch({"reward_baselines": self._greedy_baseline(prompts)}))
            with timer("reward"):
                batch, reward_metrics = self._score(batch)
            metrics |= reward_metrics
            if self.run_settings.prime is not None:
                batch, prime_metrics = self._prime_filter(batch)
                metrics |= prime_metrics
            if not fg.enable:
                break
            survivors, filter_metrics = filter_groups(batch, fg.metric)
            metrics |= filter_metrics
            kept.append(survivors)
            num_prompts += len(set(survivors["uid"]))
            if num_prompts >= train_batch_size:
                batch = Batch.concat(kept).index(slice(0, self.run_settings.train_rows))
                break
            if 0 < fg.max_num_gen_batches <= num_gen_batches:
                raise RuntimeError(
                    f"dynamic sampling: after {num_gen_batches} generation batches only {num_prompts} of "
                    f"{train_batch_size} prompts have groups whose {fg.metric!r} varies; the data is too easy or too "
                    "hard for the model. Raise algorithm.filter_groups.max_num_gen_batches (0: no limit), or lower "
                    "data.train_batch_size")
        metrics["train/num_gen_batches"] = num_gen_batches
        return batch, metrics

    def _score(self, batch: Batch) -> tuple[Batch, dict[str, Any]]:
        """``batch`` with token-level scores: from the reward model when there is one (a classifier, or a judge with
        the template and parser of reward_model.judge), else from the reward manager (whose custom function may call
        the judge)."""
        if self.roles.reward_model is not None:
            return batch.union(self.roles.reward_model.compute_rm_scores(batch)), {}
        if self.judge_in_reward_fn:  # what the function asked the judge, beside the samples
            self.judge.calls_path = os.path.join(self.tracker.run_dir, "judge", f"{self.global_step}.jsonl")
            self.judge.step = self.global_step
        if self.judge is not None and not self.judge_in_reward_fn:  # the step's samples in one batched call
            record = os.path.join(self.tracker.run_dir, "judge", f"{self.global_step}.jsonl")
            return score_with_judge(batch, self.judge, self.tokenizer, record, self.global_step)
        return score_batch(batch, self.reward_fn)

    def _prime_filter(self, batch: Batch) -> tuple[Batch, dict[str, Any]]:
        """PRIME's cut of the oversampled batch to ``data.train_batch_size`` groups, those passing the accuracy and
        truncation filters first (npu_rl.core.prime); ``acc``: the mean outcome before the cut (verl's metric)."""
        spec = self.run_settings.prime
        acc = batch["token_level_scores"].sum(-1)
        ids = as_group_ids(batch["uid"], num_samples=len(batch))
        passes = group_filter_mask(acc=acc, response_lengths=batch["response_mask"].sum(-1), group_ids=ids,
                                   filter_accuracy=spec.filter_accuracy, lower=spec.accuracy_lower_bound,
                                   upper=spec.accuracy_upper_bound, filter_truncate=spec.filter_truncate,
                                   max_response_length=self.run_settings.max_response_length)
        keep = prioritised_keep(passes, ids, keep_groups=spec.keep_prompts, n=self.run_settings.rollout_n)
        return batch.index(keep), {"acc": acc.float().mean()}

    def _implicit_prm(self, batch: Batch, timer: PhaseTimer) -> tuple[Batch, dict[str, Any]]:
        """PRIME: the outcome ``acc`` of each sample (its rule score, which must lie in [0, 1]: the PRM's
        cross-entropy target), then the implicit PRM's update and its token scores ``rm_scores``."""
        spec = self.run_settings.prime
        acc = batch["token_level_scores"].sum(-1).float()
        if bool(((acc < 0) | (acc > 1)).any()):
            raise ValueError(f"PRIME: the reward function gave scores outside [0, 1] (min {float(acc.min())}, max "
                             f"{float(acc.max())}); PRIME reads each score as the outcome's accuracy, the target of "
                             "the PRM's cross-entropy: use a 0/1 (correct / wrong) reward")
        batch = batch.union(Batch({"acc": acc}))
        metrics: dict[str, Any] = {}
        if self.roles.prm is None:  # reward_model.enable=False: the outcome's advantage alone
            return batch, metrics
        with timer("reward_model"):
            if spec.update == "before":
                metrics |= self.roles.prm.update_rm(batch).metrics
            scored = self.roles.prm.compute_rm_score(batch)
        return batch.union(scored.batch), metrics | scored.metrics

    def _greedy_baseline(self, prompts: Batch) -> torch.Tensor:
        """The score of one greedy response per prompt, repeated over its n samples (ReMax's baseline). [B*n]"""
        greedy = self.roles.actor_rollout.generate_sequences(prompts, greedy=True).batch
        scored, _ = self._score(greedy)
        return scored["token_level_scores"].sum(-1).repeat_interleave(self.run_settings.rollout_n)

    def _make_experience(self, batch: Batch, timer: PhaseTimer) -> tuple[Batch, dict[str, Any]]:
        """Old, reference and value forwards, then rewards and advantages: the batch the updates train on."""
        algo = self.config.algorithm
        metrics: dict[str, Any] = {}
        if self.config.trainer.balance_batch:
            batch, balance_metrics = balance_batch(batch, self.run_settings.actor.dp_size)
            metrics |= balance_metrics
        if algo.rollout_correction.bypass_mode:  # old log-probs := the rollout's (no recomputation)
            batch = bypass_old_logprobs(batch)
        else:
            with timer("old_log_prob"):
                old = self.roles.actor_rollout.compute_logprobs(batch)
            metrics["actor/entropy"] = M.masked_mean_tensor(old["entropy"], batch["response_mask"])
            # sum_pi_squared: the optimal-token-baseline estimators; routed_experts: R2 router replay (its update)
            kept = ["old_logprobs"] + [k for k in ("sum_pi_squared", "routed_experts") if k in old]
            batch = batch.union(old.select(kept))
            if "rollout_logprobs" in batch:
                metrics |= rollout_probs_diff_metrics(batch["rollout_logprobs"], batch["old_logprobs"],
                                                      batch["response_mask"])
            batch, correction_metrics = correct_batch(batch, self.config)  # weights, rejection, rollout_corr/*
            metrics |= correction_metrics
        if self.run_settings.use_ref:
            with timer("ref"):
                batch = batch.union(self.roles.ref.compute_ref_logprobs(batch))
        if self.roles.teacher is not None:  # a TeacherRouter (npu_rl/trainer/teachers.py): one teacher or several
            with timer("teacher"):
                taught, teacher_metrics = self.roles.teacher.compute_teacher_logprobs(batch)
            batch = batch.union(taught)
            metrics |= teacher_metrics
        if self.run_settings.prime is not None:
            batch, prm_metrics = self._implicit_prm(batch, timer)
            metrics |= prm_metrics
        if self.run_settings.use_critic:
            with timer("values"):
                batch = batch.union(self.roles.critic.compute_values(batch))
        with timer("adv"):
            rewards = batch["token_level_scores"]
            if self.run_settings.prime is not None:  # RLOO per reward source (use_kl_in_reward: no effect, as verl)
                spec = self.run_settings.prime
                out = AdvantageOutput(*prime_rloo_advantages(
                    token_scores=batch.get("rm_scores"), acc=batch["acc"], response_mask=batch["response_mask"],
                    group_ids=as_group_ids(batch["uid"], num_samples=len(batch)),
                    reward_dpo_coef=spec.reward_dpo_coef, reward_gt_coef=spec.reward_gt_coef))
                batch = batch.union(Batch({"token_level_rewards": rewards, "advantages": out.advantages,
                                           "returns": out.returns}))
                return batch, metrics
            if algo.use_kl_in_reward:
                rewards, kl_metrics = kl_in_reward(
                    token_level_scores=rewards, old_logprobs=batch["old_logprobs"],
                    ref_logprobs=batch["ref_logprobs"], response_mask=batch["response_mask"],
                    kl_coef=self.kl_ctrl.value, kl_type=algo.kl_penalty)
                self.kl_ctrl.update(current_kl=float(kl_metrics["reward_kl_penalty"]), n_steps=len(batch))
                metrics |= {f"actor/{k}": v for k, v in kl_metrics.items()}
            out = compute_advantages(adv_estimator=algo.adv_estimator, inputs=AdvantageInputs(
                token_level_rewards=rewards, response_mask=batch["response_mask"], index=batch["uid"],
                values=batch.get("values"), reward_baselines=batch.get("reward_baselines"), gamma=algo.gamma,
                lam=algo.lam, norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo, **estimator_extras(algo, batch)))
            batch = batch.union(Batch({"token_level_rewards": rewards, "advantages": out.advantages,
                                       "returns": out.returns}))
        return batch, metrics

    def _update(self, batch: Batch, timer: PhaseTimer) -> dict[str, float]:
        metrics: dict[str, float] = {}
        if self.run_settings.use_critic:
            with timer("update_critic"):
                metrics |= self.roles.critic.update_critic(batch).metrics
        if self.global_step > self.config.trainer.critic_warmup:
            with timer("update_actor"):
                metrics |= self.roles.actor_rollout.update_policy(batch).metrics
        return metrics

    # ------------------------------------------------------------------------------------------------- helpers
    def _mfu(self, batch: Batch, timer: PhaseTimer) -> dict[str, float]:
        seconds = timer.seconds.get("update_actor")
        if not seconds or self.model_config is None:
            return {}
        seqlens = batch["attention_mask"].sum(-1).tolist()
        flops = step_flops(self.model_config, seqlens) * self.config.actor_rollout_ref.actor.ppo_epochs

        dtype = to_dtype(self.config.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype)
        peak = self.backend.peak_flops(dtype) * self.roles.num_devices
        return {"perf/mfu/actor": flops / seconds / peak}

    def _memory_metrics(self) -> dict[str, float]:
        """Peak memory of every worker rank this step (max over ranks, and per rank); resets their counters."""
        report = getattr(self.roles.actor_rollout, "memory_stats", None)
        per_rank = report() if report is not None else [process_memory_stats()]
        return memory_metrics(per_rank)

    def _check_nan(self, metrics: dict[str, float]) -> None:
        skipped = metrics.get("actor/nan_skipped", 0.0) + metrics.get("critic/nan_skipped", 0.0)
        self.consecutive_nan_steps = self.consecutive_nan_steps + 1 if skipped > 0 else 0
        self.steps_run += 1
        if skipped > 0:
            self.steps_skipped += 1
            if self.first_nonfinite is None:  # said once, at the first step it happens, with what went non-finite
                self.first_nonfinite = f"step {self.global_step}: {M.likely_cause(metrics)}"
                print(f"npu-rl: warning: {self.first_nonfinite}; {int(skipped)} update(s) skipped",
                      file=sys.stderr)
        limit = self.config.trainer.max_consecutive_nan_steps
        if self.consecutive_nan_steps >= limit:
            raise NonFiniteLossError(
                f"step {self.global_step}: the loss or gradient norm was NaN/inf in {self.consecutive_nan_steps} "
                f"consecutive steps (trainer.max_consecutive_nan_steps={limit}); updates were skipped and the run is "
                f"stopped (first: {self.first_nonfinite}). Lower the learning rate, check the reward function for "
                "NaN, or use fp32 (actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32)")

    def _all_updates_skipped(self) -> int:
        """Exit code 0, or (every step of this run skipped its updates: nothing was trained) 1, said in words."""
        if self.steps_run == 0 or self.steps_skipped < self.steps_run:
            return 0
        print(f"npu-rl: error: every one of the {self.steps_run} step(s) of this run skipped its updates because a "
              f"loss or gradient was NaN/inf, so nothing was trained ({self.first_nonfinite})", file=sys.stderr)
        return 1

    def _validate(self) -> dict[str, float]:
        start = time.perf_counter()
        out = validate(self.config, self.rollouts.validator, self.val_loader, self.val_reward_fn,
                       self.tracker.run_dir, self.global_step, self.tokenizer)
        out["timing_s/testing"] = time.perf_counter() - start
        self.last_val_metrics = out
        return out

    def _log(self, metrics: dict[str, float], step: int) -> None:
        self.tracker.log(metrics, step)

    # ------------------------------------------------------------------------------------------------- checkpoints
    def trainer_state(self) -> dict[str, Any]:
        return {"global_step": self.global_step, "prompts": self.prompts.state_dict(),
                "rng": self.backend.rng_state(), "kl_ctrl": self.kl_ctrl.state_dict(),
                "consecutive_nan_steps": self.consecutive_nan_steps, "rollouts": self.rollouts.state_dict()}

    def save_checkpoint(self) -> str:
        tmp = self.checkpoints.begin(self.global_step)
        try:
            self.roles.actor_rollout.save_checkpoint(f"{tmp}/actor")
            if self.run_settings.use_critic:
                self.roles.critic.save_checkpoint(f"{tmp}/critic")
            if self.roles.prm is not None:
                self.roles.prm.save_checkpoint(f"{tmp}/reward_model")
            return self.checkpoints.commit(self.global_step, tmp, self.trainer_state())
        except BaseException as exc:  # DCP's CheckpointException is a BaseException, not an Exception
            interrupted = isinstance(exc, (KeyboardInterrupt, SystemExit))
            full = None if interrupted else disk_full_error(exc, tmp)  # before the partial folder goes
            self.checkpoints.abandon(tmp)  # latest stays on the previous step
            if full is not None:  # said in words, not as DCP's "enforce fail ... unexpected pos"
                raise full from exc
            raise

    def _resume(self) -> None:
        cfg = self.config.trainer
        path = self.checkpoints.resume_dir(cfg.resume_mode, cfg.resume_from_path)
        if path is None:
            return

        check_resume_adapter(f"{path}/actor", self.config.actor_rollout_ref.model)  # a rank change, named
        state = load_trainer_state(path)
        self.roles.actor_rollout.load_checkpoint(f"{path}/actor")
        if self.run_settings.use_critic:
            self.roles.critic.load_checkpoint(f"{path}/critic")
        if self.roles.prm is not None:
            self.roles.prm.load_checkpoint(f"{path}/reward_model")
        self.global_step = state["global_step"]
        self.prompts.load_state_dict(state["prompts"])
        self.backend.set_rng_state(state["rng"])
        self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        self.consecutive_nan_steps = state["consecutive_nan_steps"]
        self.rollouts.load_state_dict(state.get("rollouts", {}))  # asynchronous modes: versions, dropped queue
        print(f"npu-rl: resumed from {path} (step {self.global_step}, epoch {self.prompts.epoch})", file=sys.stderr)


def _progress_bar(enabled: bool, initial: int, total: int):
    from tqdm import tqdm

    # a bar redrawn into a file or Ray's log is noise: only on a terminal
    return tqdm(total=total, initial=initial, desc="training", unit="step", dynamic_ncols=True,
                disable=not enabled or not sys.stderr.isatty())


def _postfix(step_metrics: dict[str, float], val_metrics: dict[str, float]) -> dict[str, str]:
    out = {}
    if "critic/score/mean" in step_metrics:
        out["score"] = f"{step_metrics['critic/score/mean']:.3f}"
    for key, value in val_metrics.items():
        if key.startswith("val-core/") and math.isfinite(value):
            out["val"] = f"{value:.3f}"
            break
    return out
