"""Reward managers: a batch of responses -> token-level scores, per-row extras and metrics.

Every manager (registry ``REWARD_MANAGERS``, config key ``reward_model.reward_manager``) is built the same way,
``cls(tokenizer, settings: RewardSettings)``, and called the same way, ``manager(batch) -> RewardResult``.

The batch holds ``responses`` [B, R], ``response_mask`` [B, R] and the non-tensors ``data_source`` (or the
``data.reward_fn_key`` column), ``ground_truth`` and ``extra_info``. Each response is decoded without special
tokens from its valid (masked-in) tokens and scored; the score sits on the last valid token of the row:

    token_level_scores[i, last_valid(i)] = score_i        # [B, R], zero elsewhere

Managers:
    naive   one call per row of verl's ``compute_score(data_source, solution_str, ground_truth, extra_info)``
    batch   one call per chunk with lists: ``compute_score(data_sources, solution_strs, ground_truths,
            extra_infos)`` (a chunk per pool worker; the whole batch in-process)
    gdpo    naive (verl's name for it in GDPO scripts; dict results' entries are kept as extras, as everywhere)
    dapo    naive + DAPO's overlong buffer. With L the valid response length, Lmax = data.max_response_length and
            the buffer ``len`` b, ``factor`` f:  penalty = min(0, -(L - (Lmax - b)) / b * f), added to the score.
            So 0 up to Lmax - b tokens, then linearly down to -f at Lmax (verl's DAPORewardManager).

A failing scorer (an exception, NaN, a wrong type) or one that runs past ``reward_model.timeout_s`` stops the run
at once (the rest of the batch is not waited for: busy pool workers are killed) with an error naming the function,
the first failing row and how many rows failed, timed out or were left unscored, unless
``reward_model.tolerate_errors``: then such a row scores 0 and is counted in the metrics ``reward/errors`` /
``reward/timeouts``. The whole batch has one deadline, ``reward_model.batch_timeout_s``: rows not scored by then
are counted as timeouts (and stop the run unless tolerated), so N hung rows never cost N x ``timeout_s``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import numpy as np
import torch

from npu_rl.data.dataset import object_array
from npu_rl.protocol import Batch
from npu_rl.reward.pool import InProcessRunner, Outcome, ProcessPoolRunner
from npu_rl.reward.score_fn import RewardFunctionError, ScoreFnSpec
from npu_rl.reward.scorers import check_data_sources
from npu_rl.utils.deadline import Deadline
from npu_rl.utils.registry import Registry

logger = logging.getLogger(__name__)


@dataclass
class OverlongBuffer:
    enable: bool = False
    len: int = 0
    penalty_factor: float = 0.0
    log: bool = False


@dataclass
class RewardSettings:
    score_fn: ScoreFnSpec = field(default_factory=ScoreFnSpec)
    reward_fn_key: str = "data_source"
    max_response_length: Optional[int] = None
    overlong_buffer: OverlongBuffer = field(default_factory=OverlongBuffer)
    num_workers: int = 0
    timeout_s: float = 10.0  # one call (one row; one chunk for ``batch``)
    batch_timeout_s: float = 300.0  # the whole batch: one deadline, whatever the number of hung rows
    tolerate_errors: bool = False
    num_examine: int = 0  # decoded samples per data source logged (INFO) per call


@dataclass
class RewardResult:
    token_level_scores: torch.Tensor  # [B, R] float32, the score on each row's last valid token
    extra: dict[str, np.ndarray]  # per-row object arrays: score, acc, pred ..., None where a row has no value
    metrics: dict[str, float]  # reward/errors, reward/timeouts ...


REWARD_MANAGERS: Registry[type] = Registry("reward manager", "reward_model.reward_manager")


class TimeoutScoringError(TimeoutError):
    pass


def decode_responses(batch: Batch, tokenizer) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """The decoded responses, their valid lengths [B] and the index of each row's last valid token [B]."""
    responses, mask = batch["responses"].cpu(), batch["response_mask"].cpu().bool()  # [B, R]
    lengths = mask.sum(-1)  # [B]
    positions = torch.arange(mask.shape[-1]).expand_as(mask)
    last = torch.where(mask, positions, -1).max(-1).values.clamp(min=0)  # [B]; an empty response: position 0
    ids, counts = responses.tolist(), lengths.tolist()  # one host copy, then plain Python
    if bool(((last + 1 == lengths) | (lengths == 0)).all()):  # every mask a prefix (single-turn): slice
        valid = [row[:n] for row, n in zip(ids, counts)]
    else:  # masks with holes (e.g. tool output masked out): keep the masked-in tokens
        valid = [responses[i][mask[i]].tolist() for i in range(len(ids))]
    texts = tokenizer.batch_decode(valid, skip_special_tokens=True)
    eos = getattr(tokenizer, "eos_token", None)
    if eos:
        texts = [t[: -len(eos)] if t.endswith(eos) else t for t in texts]
    return texts, lengths, last


class RuleRewardManager:
    """The shared machinery; ``naive`` as is. Subclasses change how rows are grouped into calls or add terms."""

    batched = False

    def __init__(self, tokenizer, settings: RewardSettings):
        self.tokenizer = tokenizer
        self.settings = settings
        self._runner = None
        self._extra_keys: list[str] = []

    # the runner (and any worker processes) is rebuilt where the manager is used: the manager pickles as settings
    def __getstate__(self):
        state = dict(self.__dict__)
        state["_runner"] = None
        return state

    @property
    def runner(self):
        if self._runner is None:
            spec, s = self.settings.score_fn, self.settings
            self._runner = ProcessPoolRunner(spec, s.num_workers, s.timeout_s) if s.num_workers > 0 \
                else InProcessRunner(spec, s.timeout_s)
        return self._runner

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None

    def pass_to_score_fn(self, **kwargs: Any) -> None:
        """Extra keyword arguments for every call of the scoring function (the judge, npu_rl/reward/judge.py); the
        function runs in this process then (reward_model.num_workers=0, checked at validation)."""
        spec = self.settings.score_fn
        self.settings = replace(self.settings, score_fn=replace(spec, kwargs={**spec.kwargs, **kwargs}))
        self.close()

    def __call__(self, batch: Batch) -> RewardResult:
        key = self.settings.reward_fn_key
        for needed in ("responses", "response_mask", key, "ground_truth"):
            if needed not in batch:
                raise ValueError(f"reward manager: the batch has no {needed!r} field (it has {batch.keys()}); "
                                 + ("rows need reward_model.ground_truth" if needed == "ground_truth" else ""))
        texts, lengths, last = decode_responses(batch, self.tokenizer)
        data_sources, ground_truths = batch[key], batch["ground_truth"]
        extra_infos = batch.get("extra_info", object_array([{}] * len(batch)))
        for i, gt in enumerate(ground_truths):
            if gt is None:
                raise ValueError(f"reward manager: row {i} (data_source={data_sources[i]!r}) has no ground truth")
        if self.settings.score_fn.path is None:
            check_data_sources(data_sources)
        rows = [dict(data_source=ds, solution_str=t, ground_truth=gt, extra_info=dict(ei or {}))
                for ds, t, gt, ei in zip(data_sources, texts, ground_truths, extra_infos)]
        results, metrics = self._score(rows, batch)
        scores = torch.tensor([r["score"] for r in results], dtype=torch.float32)  # [B]
        scores, extra_terms, extra_metrics = self.adjust(scores, lengths)
        token_level_scores = torch.zeros(batch["responses"].shape, dtype=torch.float32)  # [B, R]
        token_level_scores[torch.arange(len(scores)), last] = scores
        # the same columns every call (the keys seen so far), so batches of one run concatenate
        self._extra_keys = list(dict.fromkeys([*self._extra_keys, *(k for r in results for k in r)]))
        extra = {k: object_array([r.get(k) for r in results]) for k in self._extra_keys} | extra_terms
        self._examine(rows, results)
        return RewardResult(token_level_scores, extra, metrics | extra_metrics)

    def adjust(self, scores: torch.Tensor, lengths: torch.Tensor):
        """Terms added to the scores (the dapo overlong penalty); none here."""
        return scores, {}, {}

    # ------------------------------------------------------------------ scoring
    def _score(self, rows: list[dict[str, Any]], batch: Batch) -> tuple[list[dict[str, Any]], dict[str, float]]:
        deadline = Deadline(self.settings.batch_timeout_s)
        stop = not self.settings.tolerate_errors  # a failure stops the run: do not wait for the rest of the batch
        if self.batched:
            chunks = np.array_split(np.arange(len(rows)), max(1, min(self.settings.num_workers, len(rows))))
            chunks = [c.tolist() for c in chunks if len(c)]
            payloads = [{"data_sources": [rows[i]["data_source"] for i in c],
                         "solution_strs": [rows[i]["solution_str"] for i in c],
                         "ground_truths": [rows[i]["ground_truth"] for i in c],
                         "extra_infos": [rows[i]["extra_info"] for i in c]} for c in chunks]
            outcomes = self.runner.run(payloads, deadline, stop)
            per_row: list[Optional[Outcome]] = [None] * len(rows)
            for chunk, outcome in zip(chunks, outcomes):
                for j, i in enumerate(chunk):
                    per_row[i] = Outcome("ok", outcome.value[j]) if outcome.status == "ok" else outcome
        else:
            per_row = self.runner.run(rows, deadline, stop)
        counts = {status: sum(o.status == status for o in per_row) for status in ("error", "timeout", "skipped")}
        problems = [(i, o) for i, o in enumerate(per_row) if o.status != "ok"]
        if problems and not self.settings.tolerate_errors:
            self._raise(problems, counts, rows, batch)
        results = [o.value if o.status == "ok" else {"score": 0.0, "acc": 0.0} for o in per_row]
        num_timeouts = counts["timeout"] + counts["skipped"]  # skipped here: the batch deadline passed first
        if problems:
            i, first = problems[0]
            logger.warning("reward: %d scorer errors and %d timeouts (%d of them never started before the batch "
                           "deadline of %g s) in a batch of %d, scored 0 (first: %s: %s)", counts["error"],
                           num_timeouts, counts["skipped"], self.settings.batch_timeout_s, len(rows),
                           _row_name(i, rows[i], batch), first.error or "timed out")
        return results, {"reward/errors": float(counts["error"]), "reward/timeouts": float(num_timeouts)}

    def _raise(self, problems: list[tuple[int, Outcome]], counts: dict[str, int], rows: list[dict[str, Any]],
               batch: Batch) -> None:
        """Stop the run: the first failed or timed-out row named, every row that did not score counted."""
        s = self.settings
        what = s.score_fn.describe()
        failed = [(i, o) for i, o in problems if o.status != "skipped"] or problems
        i, outcome = failed[0]
        where = _row_name(i, rows[i], batch)
        timed_out = [j for j, o in problems if o.status == "timeout"]
        tally = (f"{counts['timeout']} of {len(rows)} rows timed out"
                 + (f" (rows {_short_list(timed_out)})" if timed_out else "")
                 + f", {counts['error']} failed, {counts['skipped']} not scored (stopped at once)")
        hint = ("; set reward_model.tolerate_errors=True to score such rows 0 and count them in reward/errors and "
                "reward/timeouts")
        if outcome.status in ("timeout", "skipped"):
            limit = f"reward_model.timeout_s={s.timeout_s:g} s" if "per-call" in outcome.error else \
                f"the batch's deadline reward_model.batch_timeout_s={s.batch_timeout_s:g} s"
            raise TimeoutScoringError(f"{what} took longer than {limit} on {where}; {tally}{hint}, or raise "
                                      "reward_model.timeout_s / reward_model.batch_timeout_s.")
        raise RewardFunctionError(f"{what} failed on {where}: {outcome.error}; {tally}{hint}.\n{outcome.traceback}")

    def _examine(self, rows: list[dict[str, Any]], results: list[dict[str, Any]]) -> None:
        if self.settings.num_examine <= 0 or not logger.isEnabledFor(logging.INFO):
            return
        shown: dict[str, int] = {}
        for row, result in zip(rows, results):
            source = str(row["data_source"])
            if shown.get(source, 0) < self.settings.num_examine:
                shown[source] = shown.get(source, 0) + 1
                logger.info("[%s] response=%r ground_truth=%r result=%r", source, row["solution_str"][-500:],
                            row["ground_truth"], result)


def _short_list(items: list[int], limit: int = 10) -> str:
    shown = ", ".join(str(i) for i in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _row_name(i: int, row: dict[str, Any], batch: Batch) -> str:
    index = batch["index"][i] if "index" in batch else row["extra_info"].get("index")
    return f"row {i} of the batch (data_source={row['data_source']!r}, index={index})"


@REWARD_MANAGERS.register("naive")
class NaiveRewardManager(RuleRewardManager):
    """One scoring call per row (verl's ``naive``)."""


@REWARD_MANAGERS.register("prime")
class PrimeRewardManager(RuleRewardManager):
    """verl's ``prime``: the outcome score of each row (verl scores rows in a process pool: reward_model.num_workers
    here); the name also turns PRIME on (npu_rl/trainer/checks/prime.py), whose advantages read this score as the
    outcome ``acc`` of each sample."""


@REWARD_MANAGERS.register("gdpo")
class GDPORewardManager(RuleRewardManager):
    """verl's ``gdpo``: naive scoring; a dict result's entries (the GDPO reward components) become per-row extras,
    which the ``gdpo`` estimator reads by ``algorithm.gdpo_reward_keys`` (every manager here keeps them)."""


@REWARD_MANAGERS.register("batch")
class BatchRewardManager(RuleRewardManager):
    """One scoring call per chunk of rows, with lists (verl's ``batch``)."""

    batched = True


@REWARD_MANAGERS.register("dapo")
class DAPORewardManager(RuleRewardManager):
    """Naive scoring plus DAPO's overlong buffer penalty (verl's ``dapo``); see the module docstring."""

    def __init__(self, tokenizer, settings: RewardSettings):
        super().__init__(tokenizer, settings)
        check_overlong_buffer(settings.overlong_buffer, settings.max_response_length)

    def adjust(self, scores: torch.Tensor, lengths: torch.Tensor):
        buffer = self.settings.overlong_buffer
        if not buffer.enable:
            return scores, {}, {}
        penalty = overlong_penalty(lengths, self.settings.max_response_length, buffer.len, buffer.penalty_factor)
        metrics = {"reward/overlong_ratio": float((penalty < 0).float().mean()),
                   "reward/overlong_penalty_mean": float(penalty.mean())}
        extra = {}
        if buffer.log:
            extra = {"overlong_reward": object_array(penalty.tolist()),
                     "overlong": object_array((penalty < 0).tolist())}
        return scores + penalty, extra, metrics


def overlong_penalty(lengths: torch.Tensor, max_response_length: int, buffer_len: int, penalty_factor: float
                     ) -> torch.Tensor:
    """DAPO's soft overlong punishment [B]: 0 until ``max - buffer_len`` tokens, then linear down to ``-factor``."""
    expected = max_response_length - buffer_len
    exceed = lengths.float() - expected  # [B]
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)


def check_overlong_buffer(buffer, max_response_length: Optional[int]) -> None:
    if not buffer.enable:
        return
    if buffer.len <= 0:
        raise ValueError(f"reward_model.overlong_buffer.len must be > 0 when enabled, got {buffer.len}")
    if buffer.penalty_factor < 0:
        raise ValueError(f"reward_model.overlong_buffer.penalty_factor must be >= 0, got {buffer.penalty_factor}")
    if max_response_length is None or max_response_length < buffer.len:
        raise ValueError(f"reward_model.overlong_buffer.len={buffer.len} must not exceed data.max_response_length="
                         f"{max_response_length}")
