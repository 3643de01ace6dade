"""Validation: generate on the held-out prompts with ``rollout.val_kwargs``, score, and report per data source.

Keys (verl's): ``val-core/<data_source>/<metric>/mean@N`` for the headline metric (``acc`` when the scorer gives
one, else ``reward``, the sequence score), ``val-aux/...`` for the others; with N > 1 samples per prompt also
``best@N`` (the fraction of prompts solved by at least one sample: pass@N for a 0/1 metric).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import numpy as np

from npu_rl.protocol import Batch
from npu_rl.trainer.sampling import score_batch


def _numeric(values) -> np.ndarray | None:
    try:
        out = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return out if out.ndim == 1 else None


def validation_metrics(rows: Batch, n: int) -> dict[str, float]:
    """Per data source and metric: mean@n (and best@n when n > 1). Rows are grouped n at a time by ``uid``."""
    series = {"reward": rows["token_level_scores"].sum(-1).numpy()}
    for key in rows.non_tensors:
        if key in ("uid", "data_source", "ground_truth", "extra_info", "index", "raw_prompt", "pred"):
            continue
        values = _numeric(rows[key])
        if values is not None:
            series[key] = values
    core = "acc" if "acc" in series else "reward"
    sources, uids = rows["data_source"], rows["uid"]
    out: dict[str, float] = {}
    for source in dict.fromkeys(sources):
        in_source = sources == source
        for name, values in series.items():
            prefix = f"val-{'core' if name == core else 'aux'}/{source}/{name}"
            out[f"{prefix}/mean@{n}"] = float(values[in_source].mean())
            if n > 1:
                per_prompt = defaultdict(list)
                for uid, value in zip(uids[in_source], values[in_source]):
                    per_prompt[uid].append(value)
                out[f"{prefix}/best@{n}"] = float(np.mean([max(v) for v in per_prompt.values()]))
    return out


def validate(config, actor_rollout, val_loader, val_reward_fn, run_dir: str, step: int, tokenizer=None
             ) -> dict[str, float]:
    scored: list[Batch] = []
    for prompts in val_loader:
        out, _ = score_batch(actor_rollout.generate_sequences(prompts, validate=True).batch, val_reward_fn)
        keep = [k for k in out.keys() if k not in ("input_ids", "position_ids", "rollout_logprobs")]
        scored.append(out.select(keep, meta=False))
    rows = Batch.concat(scored)
    n = config.actor_rollout_ref.rollout.val_kwargs.n
    metrics = validation_metrics(rows, n)
    metrics["val-aux/response_length/mean"] = float(rows["response_mask"].sum(-1).float().mean())
    _log_generations(rows, config.trainer.log_val_generations, run_dir, step, tokenizer)
    if config.trainer.validation_data_dir and tokenizer is not None:  # every validation sample, one file per step
        dump_generations(rows, tokenizer, os.path.join(config.trainer.validation_data_dir, f"{step}.jsonl"), step)
    return metrics


def dump_generations(rows: Batch, tokenizer, path: str, step: int, limit: int | None = None) -> None:
    """Append decoded samples (prompt, response, score, ground truth, data source) to a JSONL file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    count = len(rows) if limit is None else min(limit, len(rows))
    with open(path, "a", encoding="utf-8") as f:
        for i in range(count):
            mask = rows["response_mask"][i].bool()
            record = {"step": step, "data_source": str(rows["data_source"][i]),
                      "response": tokenizer.decode(rows["responses"][i][mask], skip_special_tokens=False),
                      "score": float(rows["token_level_scores"][i].sum())}
            if "prompts" in rows:
                prompt_mask = rows["attention_mask"][i, : rows["prompts"].shape[1]].bool()
                record["prompt"] = tokenizer.decode(rows["prompts"][i][prompt_mask], skip_special_tokens=False)
            if "advantages" in rows:
                record["advantage"] = float(rows["advantages"][i][mask][:1].sum())
            if "ground_truth" in rows:
                record["ground_truth"] = str(rows["ground_truth"][i])
            f.write(json.dumps(record) + "\n")


def _log_generations(rows: Batch, count: int, run_dir: str, step: int, tokenizer) -> None:
    """The first ``count`` validation samples, appended to ``val_generations.jsonl`` in the run folder."""
    if count > 0 and tokenizer is not None:
        dump_generations(rows, tokenizer, os.path.join(run_dir, "val_generations.jsonl"), step, limit=count)
