"""Several distillation teachers (npu_rl/trainer/teachers.py): each row goes to the teacher its routing field names,
each teacher sees only its rows, the outputs land back in the rows' places, the loss of each row is taken against its
own teacher, and the metrics are per teacher. Numbers worked by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from npu_rl.core.distillation import distillation_token_losses
from npu_rl.protocol import Batch
from npu_rl.trainer.teachers import TeacherRouter


class _Teacher:
    """A stand-in teacher: log-prob ``value`` at every token, top-2 ids (value, value + 1); records the rows it got."""

    def __init__(self, value: float):
        self.value = value
        self.seen: list[list[int]] = []

    def compute_teacher_logprobs(self, batch: Batch) -> Batch:
        self.seen.append(batch["row"].tolist())
        n, r = batch["responses"].shape
        ids = torch.tensor([int(-self.value), int(-self.value) + 1]).expand(n, r, 2)
        return Batch({"teacher_logprobs": torch.full((n, r), self.value), "teacher_topk_ids": ids,
                      "teacher_topk_logprobs": torch.full((n, r, 2), self.value)})


def _batch(sources: list[str]) -> Batch:
    n = len(sources)
    # old log-probs -0.5 everywhere; row i has i % 2 + 1 valid response tokens of 2
    return Batch({"row": torch.arange(n), "responses": torch.ones(n, 2, dtype=torch.long),
                  "response_mask": torch.tensor([[1, i % 2] for i in range(n)]),
                  "old_logprobs": torch.full((n, 2), -0.5)},
                 {"data_source": np.array(sources, dtype=object)})


def test_each_row_goes_to_its_own_teacher_and_back_to_its_place():
    gsm8k, geo = _Teacher(-1.0), _Teacher(-3.0)
    router = TeacherRouter({"openai/gsm8k": gsm8k, "hiyouga/geometry3k": geo}, "data_source")
    batch = _batch(["openai/gsm8k", "hiyouga/geometry3k", "hiyouga/geometry3k", "openai/gsm8k", "openai/gsm8k"])
    out, metrics = router.compute_teacher_logprobs(batch)
    assert gsm8k.seen == [[0, 3, 4]] and geo.seen == [[1, 2]]  # one forward each, on its own rows only
    assert out["teacher_logprobs"][:, 0].tolist() == [-1.0, -3.0, -3.0, -1.0, -1.0]
    assert out["teacher_topk_ids"][:, 0].tolist() == [[1, 2], [3, 4], [3, 4], [1, 2], [1, 2]]
    assert out["teacher_topk_logprobs"].shape == (5, 2, 2)
    # the loss of each row against its own teacher: k1 = s - q with s = -0.5 -> 0.5 (gsm8k rows), 2.5 (geometry)
    k1 = distillation_token_losses(student_logprobs=batch["old_logprobs"], teacher_logprobs=out["teacher_logprobs"],
                                   loss_mode="k1")
    torch.testing.assert_close(k1[:, 0], torch.tensor([0.5, 2.5, 2.5, 0.5, 0.5]))
    # per teacher: gsm8k rows 0, 3, 4 have 1, 2, 1 valid tokens (4), each k1 0.5 -> 0.5; geometry rows 1, 2 have
    # 2 + 1 valid tokens, each 2.5 -> 2.5
    assert metrics["distillation/openai/gsm8k/num_rows"] == 3 and metrics["distillation/hiyouga/geometry3k/num_rows"] == 2
    torch.testing.assert_close(metrics["distillation/openai/gsm8k/reverse_kl_k1"], torch.tensor(0.5))
    torch.testing.assert_close(metrics["distillation/hiyouga/geometry3k/reverse_kl_k1"], torch.tensor(2.5))


def test_a_teacher_without_rows_runs_no_forward_and_one_teacher_takes_every_row():
    gsm8k, geo = _Teacher(-1.0), _Teacher(-3.0)
    out, metrics = TeacherRouter({"a": gsm8k, "b": geo}, "data_source").compute_teacher_logprobs(_batch(["a", "a"]))
    assert gsm8k.seen == [[0, 1]] and geo.seen == [] and "distillation/b/num_rows" not in metrics
    only = _Teacher(-2.0)
    out, metrics = TeacherRouter({"default": only}, "data_source").compute_teacher_logprobs(_batch(["x", "y", "z"]))
    assert only.seen == [[0, 1, 2]] and metrics == {}  # whatever the field says
    assert out["teacher_logprobs"].flatten().tolist() == [-2.0] * 6


def test_a_row_no_teacher_claims_stops_the_step_naming_it():
    router = TeacherRouter({"a": _Teacher(-1.0), "b": _Teacher(-2.0)}, "data_source")
    with pytest.raises(ValueError, match=r"row 1: distillation.teacher_key='data_source' is 'c', which no teacher's "
                                         r"key names \(teachers: \['a', 'b'\]"):
        router.compute_teacher_logprobs(_batch(["a", "c", "b"]))
    with pytest.raises(KeyError, match="distillation.teacher_key='task': the batch has no such field"):
        TeacherRouter({"a": _Teacher(-1.0), "b": _Teacher(-2.0)}, "task").compute_teacher_logprobs(_batch(["a"]))
