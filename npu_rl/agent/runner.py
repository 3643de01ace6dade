"""Running agent loops over a rollout batch and turning their conversations into the trainer's batch.

Every sample (``n`` per prompt) runs its agent loop as an asyncio task. Generation goes through a server:

- :class:`TurnBatchingServer` (the ``hf`` and sync ``vllm`` engines): requests are collected until every live loop
  is waiting on the model (the others are running tools or have finished), then generated in one engine call with
  a budget per request. Samples interleave at turn granularity: a sample on its third turn shares an engine call
  with one on its first; a finished sample frees its slot.

Output batch (the fields of :mod:`npu_rl.rollout.base`, for ``B*n`` rows):
``prompts`` [B*n, P] (left-padded; P = the longest prompt of the batch: the agent's own rendering, e.g. with tools),
``responses`` [B*n, R], ``input_ids`` / ``attention_mask`` / ``position_ids`` [B*n, P+R] (attention 1 on every real
token: tool output is context), ``response_mask`` [B*n, R] (1 only on model-generated tokens), ``rollout_logprobs``
(when asked; 0 off the mask); non-tensors of the input repeated, plus ``__num_turns__``, ``tool_rewards``,
``turn_scores``, ``num_tool_calls``, ``called_tool`` (validation reports the numeric ones per data source);
The metrics returned beside the batch have verl's ``num_turns/{min,max,mean}`` and the ``agent_loop/*`` figures.

A loop that raises (``SystemExit`` included), or returns something else than an ``AgentOutput``, fails only its own
sample: logged naming the row and the loop, counted in ``agent_loop/failed_samples``, kept in the batch with an
empty response (mask 0: nothing is trained on it). A batch in which every sample failed raises, naming the first
failure, so a run never ends "finished" with nothing trained. An engine error fails the whole rollout, and so does a loop, tool or interaction that calls ``os._exit``: an
error naming the row, the loop and the function (``user_code.py``), never a silent end of the trainer.

A loop that awaits something of its own that never completes would hold every other sample (the server waits for
all live loops): each sample's own time -- wall time minus the time it waits on the model, which is shared with the
whole batch -- is bounded by ``rollout.agent.sample_timeout_s``. Past it the sample's task is cancelled and it fails
as above ("did not finish within ..."); a task that swallows its cancellation is abandoned, never waited for, and
threads a loop started with ``asyncio.to_thread`` are daemon threads (``user_code.run_agents_loop``).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from dataclasses import replace
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from npu_rl.agent.loops import (AgentContext, AgentOutput, AgentSample, AgentSampleError, TokenOutput,
                                row_agent_loop)
from npu_rl.agent.user_code import UserCodeExit, run_agents_loop
from npu_rl.data.dataset import object_array
from npu_rl.protocol import Batch
from npu_rl.rollout.base import Generation
from npu_rl.utils.exit_guard import ExitAttempt

logger = logging.getLogger(__name__)

BatchGenerate = Callable[[list[list[int]], list[int]], list[tuple[list[int], Optional[list[float]]]]]


class EngineError(RuntimeError):
    """The generation engine failed: the whole rollout fails (``original``: what it raised)."""

    def __init__(self, message: str, original: BaseException):
        super().__init__(message)
        self.original = original


class AgentExitError(RuntimeError):
    """User code of an agent loop (the loop, a tool, an interaction) called ``os._exit``: the rollout stops."""


class SampleClock:
    """One sample's own time: wall time since it started, less the time it spent waiting on the model (generation
    serves the whole batch, so it is nobody's own time). Waits may nest (a loop generating twice at once)."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self._waiting = 0
        self._wait_start = 0.0
        self._waited = 0.0

    def wait_begins(self) -> None:
        if self._waiting == 0:
            self._wait_start = time.monotonic()
        self._waiting += 1

    def wait_ends(self) -> None:
        self._waiting -= 1
        if self._waiting == 0:
            self._waited += time.monotonic() - self._wait_start

    def own_s(self) -> float:
        now = time.monotonic()
        return now - self.start - self._waited - (now - self._wait_start if self._waiting else 0.0)


_sample_clock: contextvars.ContextVar[Optional[SampleClock]] = contextvars.ContextVar("npu_rl_sample_clock",
                                                                                       default=None)


class TurnBatchingServer:
    """Collects generation requests until all live loops wait, then serves them with one ``batch_generate`` call."""

    def __init__(self, batch_generate: BatchGenerate):
        self.batch_generate = batch_generate
        self.live = 0
        self._pending: list[tuple[list[int], int, asyncio.Future]] = []
        self.num_engine_calls = 0
        self.requests_per_call: list[int] = []

    async def generate(self, prompt_ids: list[int], max_tokens: int) -> TokenOutput:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((list(prompt_ids), int(max_tokens), future))
        clock = _sample_clock.get()  # the calling sample's (tasks inherit it)
        if clock is not None:
            clock.wait_begins()
        try:
            self.maybe_flush()
            return await future
        finally:
            if clock is not None:
                clock.wait_ends()

    def loop_finished(self) -> None:
        self.live -= 1
        self.maybe_flush()

    def maybe_flush(self) -> None:
        if not self._pending or len(self._pending) < self.live:
            return
        pending, self._pending = self._pending, []
        self.num_engine_calls += 1
        self.requests_per_call.append(len(pending))
        try:
            results = self.batch_generate([p[0] for p in pending], [p[1] for p in pending])
        except Exception as exc:  # every waiting loop sees the engine's error (which ends the rollout)
            for _, _, future in pending:
                future.set_exception(EngineError(f"{type(exc).__name__}: {exc}", exc))
            return
        for (_, _, future), (ids, logprobs) in zip(pending, results):
            future.set_result(TokenOutput(list(ids), list(logprobs) if logprobs is not None else None))


def row_agent_names(prompts: Batch, default: str) -> list[str]:
    names = prompts.non_tensors.get("agent_name")
    if names is None:
        return [default] * len(prompts)
    return [str(n) if n is not None and str(n) else default for n in names]


def samples_of(prompts: Batch) -> list[AgentSample]:
    raw = prompts.non_tensors.get("raw_prompt")
    extra = prompts.non_tensors.get("extra_info")
    ids, mask = prompts["input_ids"].cpu(), prompts["attention_mask"].cpu().bool()
    return [AgentSample(prompt_ids=ids[i][mask[i]].tolist(),
                        messages=[dict(m) for m in raw[i]] if raw is not None and raw[i] is not None else None,
                        extra_info=dict(extra[i] or {}) if extra is not None else {}, row=i)
            for i in range(len(prompts))]


def failed_output(sample: AgentSample, name: str, exc: BaseException) -> AgentOutput:
    """A sample whose loop raised (``SystemExit`` included) or returned something else than an ``AgentOutput``: its
    prompt with an empty response (nothing to train on), the reason kept, logged naming the row and the loop."""
    reason = str(exc) if isinstance(exc, AgentSampleError) else \
        f"row {sample.row}: agent loop {name!r} raised {type(exc).__name__}: {exc}"
    logger.warning("agent loop failed sample: %s", reason)
    return AgentOutput(list(sample.prompt_ids), [], [], [], num_turns=1, failed=reason)


async def _run_one(loop: Any, name: str, sample: AgentSample) -> AgentOutput:
    try:
        out = await loop.run(sample)
    except (KeyboardInterrupt, asyncio.CancelledError, GeneratorExit, EngineError):
        raise  # the user's interrupt, a cancelled run or sample, an abandoned one collected, or the engine down
    except UserCodeExit as exc:  # a tool or an interaction of this loop
        raise AgentExitError(f"row {sample.row}: agent loop {name!r}: {exc}") from None
    except ExitAttempt as exc:  # the loop's own code (run_agents_loop guards the agents' loop)
        raise AgentExitError(f"row {sample.row}: agent loop {name!r} called {exc}, which would have ended the "
                             "trainer") from None
    except BaseException as exc:  # noqa: BLE001 - SystemExit in a user's loop included: a failed sample, counted
        return failed_output(sample, name, exc)
    if not isinstance(out, AgentOutput):
        return failed_output(sample, name, AgentSampleError(
            f"row {sample.row}: agent loop {name!r} returned {type(out).__name__}, not an AgentOutput"))
    return out


async def _run_all(context: AgentContext, server: TurnBatchingServer, names: Sequence[str],
                   samples: Sequence[AgentSample]) -> list[AgentOutput]:
    server.live = len(samples)
    loops: dict[str, Any] = {}
    problems: dict[str, BaseException] = {}
    for name in set(names):
        try:
            loops[name] = row_agent_loop(name)(context)
        except (KeyboardInterrupt, SystemExit):
            raise
        except ExitAttempt as exc:
            raise AgentExitError(f"agent loop {name!r}: making it called {exc}, which would have ended the "
                                 "trainer") from None
        except Exception as exc:  # noqa: BLE001 - refused at start-up already; here each of its rows fails
            problems[name] = exc
    finished: set[int] = set()

    def finish(i: int) -> None:  # once per sample: when its task ends, or when it is given up
        if i not in finished:
            finished.add(i)
            server.loop_finished()

    async def one(i: int, name: str, sample: AgentSample, clock: SampleClock) -> AgentOutput:
        _sample_clock.set(clock)
        try:
            if name in problems:
                return failed_output(sample, name, problems[name])
            return await _run_one(loops[name], name, sample)
        finally:
            finish(i)

    timeout_s = context.settings.sample_timeout_s
    clocks = [SampleClock() for _ in samples]
    tasks = {asyncio.create_task(one(i, n, s, clocks[i]), name=f"row {s.row} ({n})"): i
             for i, (n, s) in enumerate(zip(names, samples))}
    outputs: list[Optional[AgentOutput]] = [None] * len(samples)
    pending = set(tasks)
    try:
        while pending:
            left = min(timeout_s - clocks[tasks[t]].own_s() for t in pending)
            done, pending = await asyncio.wait(pending, timeout=max(0.01, min(left, 1.0)),
                                               return_when=asyncio.FIRST_COMPLETED)
            # read every finished task's error before raising the first: another one left unread would be logged
            # with its traceback when collected ("Task exception was never retrieved")
            error = next((e for e in [t.exception() for t in done if not t.cancelled()] if e is not None), None)
            if error is not None:
                raise error  # an engine error, an interrupt or user code ending the process ends the rollout here
            for task in done:
                i = tasks[task]
                outputs[i] = failed_output(samples[i], names[i], AgentSampleError(
                    f"row {samples[i].row}: agent loop {names[i]!r} was cancelled (not by npu-rl)")) \
                    if task.cancelled() else task.result()
            for task in [t for t in pending if clocks[tasks[t]].own_s() >= timeout_s]:
                i = tasks[task]
                task.cancel()  # run_agents_loop gives it a moment to end and abandons it if it will not
                pending.discard(task)
                outputs[i] = failed_output(samples[i], names[i], AgentSampleError(
                    f"row {samples[i].row}: agent loop {names[i]!r} did not finish within "
                    f"rollout.agent.sample_timeout_s={timeout_s:g} s of its own time (time waiting on the model "
                    f"not counted); cancelled"))
                finish(i)
    finally:
        for task in pending:
            task.cancel()
    return outputs  # type: ignore[return-value]


def run_agent_loops(prompts: Batch, context: AgentContext, batch_generate: BatchGenerate, n: int,
                    pad_token_id: int, response_length: int, return_logprobs: bool) -> Generation:
    """``n`` conversations per prompt (interleaved rows), assembled into the rollout batch (module docstring)."""
    rows = prompts.repeat(n, interleave=True)
    names = row_agent_names(rows, context.settings.default_agent_loop)
    server = TurnBatchingServer(batch_generate)
    context = replace(context, server=server)
    try:
        outputs = run_agents_loop(_run_all(context, server, names, samples_of(rows)))
    except EngineError as exc:
        raise exc.original from None
    failed = [o.failed for o in outputs if o.failed is not None]
    if failed and len(failed) == len(outputs):
        raise RuntimeError(f"every agent conversation of this batch failed ({len(failed)} samples), so there is "
                           f"nothing to train on; the first: {failed[0]}")
    batch = assemble_agent_batch(rows, outputs, pad_token_id, response_length, return_logprobs)
    return Generation(batch, agent_metrics(outputs) | {
        "agent_loop/engine_calls": float(server.num_engine_calls),
        "agent_loop/requests_per_engine_call/mean": float(np.mean(server.requests_per_call or [0]))})


def assemble_agent_batch(rows: Batch, outputs: Sequence[AgentOutput], pad_token_id: int, response_length: int,
                         return_logprobs: bool) -> Batch:
    num = len(outputs)
    width = max(max(len(o.prompt_ids) for o in outputs), rows["input_ids"].shape[1])
    prompts = torch.full((num, width), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((num, width), dtype=torch.long)
    responses = torch.full((num, response_length), pad_token_id, dtype=torch.long)
    response_attention = torch.zeros((num, response_length), dtype=torch.long)
    response_mask = torch.zeros((num, response_length), dtype=torch.long)
    logprobs = torch.zeros((num, response_length), dtype=torch.float32)
    for i, o in enumerate(outputs):
        p = len(o.prompt_ids)
        if p:
            prompts[i, width - p:] = torch.tensor(o.prompt_ids)
            prompt_mask[i, width - p:] = 1
        r = min(len(o.response_ids), response_length)
        if r:
            responses[i, :r] = torch.tensor(o.response_ids[:r])
            response_attention[i, :r] = 1
            response_mask[i, :r] = torch.tensor(o.response_mask[:r])
            logprobs[i, :r] = torch.tensor(o.logprobs[:r], dtype=torch.float32)
    logprobs = logprobs * response_mask
    prompt_positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    response_positions = prompt_positions[:, -1:] + torch.arange(1, response_length + 1).unsqueeze(0)
    out = rows  # a fresh batch from repeat(); its prompt tensors are replaced
    for key in ("input_ids", "attention_mask", "position_ids"):
        out.tensors.pop(key, None)
    tensors = {
        "prompts": prompts, "responses": responses, "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], -1),
        "attention_mask": torch.cat([prompt_mask, response_attention], -1),
        "position_ids": torch.cat([prompt_positions, response_positions], -1),
    }
    if return_logprobs:
        tensors["rollout_logprobs"] = logprobs
    for key, value in tensors.items():
        out[key] = value
    out["__num_turns__"] = object_array([o.num_turns for o in outputs])
    out["num_tool_calls"] = object_array([o.num_tool_calls for o in outputs])  # (validation reports per-row columns)
    out["called_tool"] = object_array([float(o.num_tool_calls > 0) for o in outputs])
    out["tool_rewards"] = object_array([list(o.tool_rewards) for o in outputs])
    out["turn_scores"] = object_array([list(o.turn_scores) for o in outputs])
    return out


def _stats(name: str, values: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return {}
    return {f"{name}/min": float(arr.min()), f"{name}/max": float(arr.max()), f"{name}/mean": float(arr.mean())}


def agent_metrics(outputs: Sequence[AgentOutput]) -> dict[str, float]:
    """verl's ``num_turns/*`` and ``agent_loop/{generate_sequences,tool_calls}/*`` (seconds per sample), plus
    tool-call counts, errors, timeouts and model tokens by assistant turn."""
    metrics = _stats("num_turns", [o.num_turns for o in outputs])
    metrics |= _stats("agent_loop/generate_sequences", [o.generate_s for o in outputs])
    metrics |= _stats("agent_loop/tool_calls", [o.tool_s for o in outputs])
    metrics |= _stats("agent_loop/num_tool_calls", [o.num_tool_calls for o in outputs])
    metrics["agent_loop/tool_call_rate"] = float(np.mean([o.num_tool_calls > 0 for o in outputs]))
    metrics["agent_loop/tool_errors"] = float(sum(o.num_tool_errors for o in outputs))
    metrics["agent_loop/tool_timeouts"] = float(sum(o.num_tool_timeouts for o in outputs))
    metrics["agent_loop/failed_samples"] = float(sum(o.failed is not None for o in outputs))
    max_turns = max((len(o.turn_lengths) for o in outputs), default=0)
    for k in range(max_turns):
        lengths = [o.turn_lengths[k] for o in outputs if len(o.turn_lengths) > k]
        metrics[f"agent_loop/response_length/turn_{k + 1}/mean"] = float(np.mean(lengths))
    return metrics
