"""Several distillation teachers (multi-teacher on-policy distillation, MOPD): each row goes to the teacher whose
``key`` equals the row's ``distillation.teacher_key`` field (verl's rule; e.g. ``data_source``: a math teacher for
GSM8K rows, another for geometry rows), each teacher's forward runs on its own rows only, and its log-probs (and
top-k) are put back in the rows' places, so the distillation loss of each row is taken against its own teacher.
One teacher takes every row, whatever its field.

Metrics per teacher, under ``distillation/<key>/``: ``num_rows``, and ``reverse_kl_k1``: the mean over its rows'
response tokens of old log-prob - teacher log-prob (k1, the reverse-KL estimate at the student's samples; the old
log-probs are at the rollout temperature, the teacher's at 1), when the batch has old log-probs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from npu_rl.protocol import Batch

OUTPUTS = ("teacher_logprobs", "teacher_topk_logprobs", "teacher_topk_ids")


class TeacherRouter:
    """``compute_teacher_logprobs(batch)`` over one or several teacher handles (``{key: handle}``), returning the
    batch of teacher outputs and the per-teacher metrics."""

    def __init__(self, handles: dict[str, Any], teacher_key: str):
        self.handles = dict(handles)
        self.teacher_key = teacher_key

    def route(self, batch: Batch) -> dict[str, np.ndarray]:
        """``{key: row indices}`` of each teacher with rows; a row whose field names no teacher stops the run."""
        if len(self.handles) == 1:
            return {next(iter(self.handles)): np.arange(len(batch))}
        if self.teacher_key not in batch:
            raise KeyError(f"distillation.teacher_key={self.teacher_key!r}: the batch has no such field (it has "
                           f"{sorted(batch.keys())}); several teachers are picked by a field of each row")
        values = [str(v.item() if hasattr(v, "item") else v) for v in batch[self.teacher_key]]
        unknown = sorted({v for v in values if v not in self.handles})
        if unknown:
            row = next(i for i, v in enumerate(values) if v in unknown)
            raise ValueError(f"row {row}: distillation.teacher_key={self.teacher_key!r} is {values[row]!r}, which no "
                             f"teacher's key names (teachers: {sorted(self.handles)}; unrouted values: {unknown}); "
                             "add a teacher with that key (+distillation.teacher_models.<name>.key=...)")
        values_array = np.asarray(values, dtype=object)
        return {key: rows for key in self.handles if len(rows := np.flatnonzero(values_array == key))}

    def compute_teacher_logprobs(self, batch: Batch) -> tuple[Batch, dict[str, torch.Tensor]]:
        if len(self.handles) == 1:
            return next(iter(self.handles.values())).compute_teacher_logprobs(batch), {}
        routes = self.route(batch)
        outputs: dict[str, torch.Tensor] = {}
        metrics: dict[str, torch.Tensor] = {}
        for key, rows in routes.items():
            part = batch if len(rows) == len(batch) else batch.index(rows)
            out = self.handles[key].compute_teacher_logprobs(part)
            index = torch.as_tensor(rows)
            for name in OUTPUTS:
                if name in out:
                    if name not in outputs:
                        value = out[name]
                        outputs[name] = value.new_zeros((len(batch), *value.shape[1:]))
                    outputs[name][index] = out[name]
            metrics |= _teacher_metrics(key, part, out["teacher_logprobs"])
        return Batch(outputs), metrics


def _teacher_metrics(key: str, part: Batch, teacher_logprobs: torch.Tensor) -> dict[str, torch.Tensor]:
    metrics = {f"distillation/{key}/num_rows": torch.tensor(float(len(part)))}
    if "old_logprobs" in part:
        mask = part["response_mask"].to(teacher_logprobs.dtype)
        k1 = (part["old_logprobs"].to(teacher_logprobs.dtype) - teacher_logprobs) * mask
        metrics[f"distillation/{key}/reverse_kl_k1"] = k1.sum() / mask.sum().clamp(min=1)
    return metrics
