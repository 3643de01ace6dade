"""The distillation teacher: the reference's forward-only engine on the teacher's folder; its log-probs of the
response tokens equal an unpadded transformers forward at temperature 1, whatever the rollout's temperature; with
``loss_mode=forward_kl_topk`` its top-k log-probs and ids too."""

from __future__ import annotations

import pytest
import torch

from npu_rl.config.loader import load_config
from npu_rl.protocol import Batch
from npu_rl.trainer.preflight import run_settings_for
from npu_rl.workers.roles import worker_specs
from tests.trainer.conftest import base_overrides


@pytest.mark.parametrize("topk", [0, 3])
def test_teacher_logprobs_equal_a_transformers_forward_at_temperature_one(tiny_model_dir, tmp_path, topk):
    from transformers import AutoModelForCausalLM

    from tests.helpers import save_tiny_model_dir

    teacher = save_tiny_model_dir(str(tmp_path / "teacher"), seed=5)
    loss = (["distillation.distillation_loss.loss_mode=forward_kl_topk", f"distillation.distillation_loss.topk={topk}"]
            if topk else [])
    config = load_config(base_overrides(tiny_model_dir, str(tmp_path / "run")) + [
        "preset=grpo", "actor_rollout_ref.rollout.temperature=0.7", "distillation.enabled=True",
        f"distillation.teacher_models.teacher_model.model_path={teacher}",
        "distillation.teacher_models.teacher_model.fsdp_config.mixed_precision.param_dtype=fp32",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1", "data.max_response_length=3"] + loss)
    spec = worker_specs(config, run_settings_for(config))["teacher"]
    worker = spec.cls(*spec.args)
    worker.init_model()
    prompts = torch.tensor([[0, 0, 10, 11], [0, 12, 13, 14]])  # left-padded to 4
    responses = torch.tensor([[20, 21, 0], [22, 0, 0]])  # right-padded to 3
    response_mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    attention_mask = torch.cat([(prompts != 0).long(), response_mask], 1)
    batch = Batch({"prompts": prompts, "responses": responses, "response_mask": response_mask,
                   "input_ids": torch.cat([prompts, responses], 1), "attention_mask": attention_mask,
                   "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0)})
    result = worker.compute_teacher_logprobs(batch)
    out = result["teacher_logprobs"]
    if topk:
        assert result["teacher_topk_logprobs"].shape == result["teacher_topk_ids"].shape == (2, 3, topk)
    else:
        assert "teacher_topk_ids" not in result
    reference = AutoModelForCausalLM.from_pretrained(teacher).eval()
    for row, (prompt, response) in enumerate([([10, 11], [20, 21]), ([12, 13, 14], [22])]):
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            logp = torch.log_softmax(reference(input_ids=ids).logits[0].float(), -1)  # temperature 1
        expected = torch.stack([logp[len(prompt) - 1 + i, tok] for i, tok in enumerate(response)])
        torch.testing.assert_close(out[row, :len(response)], expected, rtol=1e-5, atol=1e-5)
        if topk:  # the top-k of the same distributions, at the positions that predict the response tokens
            positions = [len(prompt) - 1 + i for i in range(len(response))]
            want_lp, want_ids = torch.topk(logp[positions], topk, dim=-1)
            assert torch.equal(result["teacher_topk_ids"][row, :len(response)], want_ids)
            torch.testing.assert_close(result["teacher_topk_logprobs"][row, :len(response)], want_lp, rtol=1e-5,
                                       atol=1e-5)


def test_two_teachers_beside_the_actor_each_score_their_own_rows(tiny_model_dir, tmp_path):
    """MOPD with distillation.nnodes=0: two teacher workers in this process behind the router; each row's log-probs
    are those its own teacher gives when it scores that row alone."""
    import numpy as np

    from npu_rl.controller.worker_group import LocalWorkerGroup
    from npu_rl.trainer.teachers import TeacherRouter
    from npu_rl.workers.roles import teacher_roles
    from tests.helpers import save_tiny_model_dir

    teachers = {"a": save_tiny_model_dir(str(tmp_path / "a"), seed=5), "b": save_tiny_model_dir(str(tmp_path / "b"),
                                                                                               seed=6)}
    entries = [o for key, path in teachers.items() for o in (
        f"+distillation.teacher_models.t{key}.key=src/{key}", f"+distillation.teacher_models.t{key}.model_path={path}",
        f"+distillation.teacher_models.t{key}.fsdp_config.mixed_precision.param_dtype=fp32")]
    config = load_config(base_overrides(tiny_model_dir, str(tmp_path / "run")) + [
        "preset=grpo", "distillation.enabled=True", "data.max_response_length=3"] + entries)
    roles = teacher_roles(config)
    assert roles == {"teacher[src/a]": "src/a", "teacher[src/b]": "src/b"}
    specs = worker_specs(config, run_settings_for(config))
    group = LocalWorkerGroup({name: specs[name] for name in roles})
    for name in roles:
        group.worker(name).init_model()
    router = TeacherRouter({key: getattr(group, name) for name, key in roles.items()}, "data_source")
    prompts = torch.tensor([[0, 0, 10, 11], [0, 12, 13, 14], [15, 16, 17, 18]])
    responses = torch.tensor([[20, 21, 0], [22, 0, 0], [23, 24, 25]])
    response_mask = (responses != 0).long()
    attention_mask = torch.cat([(prompts != 0).long(), response_mask], 1)
    batch = Batch({"prompts": prompts, "responses": responses, "response_mask": response_mask,
                   "input_ids": torch.cat([prompts, responses], 1), "attention_mask": attention_mask,
                   "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0)},
                  {"data_source": np.array(["src/b", "src/a", "src/b"], dtype=object)})
    out, metrics = router.compute_teacher_logprobs(batch)
    assert metrics["distillation/src/a/num_rows"] == 1 and metrics["distillation/src/b/num_rows"] == 2
    for row, key in enumerate(["b", "a", "b"]):
        alone = group.worker(f"teacher[src/{key}]").compute_teacher_logprobs(batch.index([row]))
        mask = response_mask[row].bool()
        torch.testing.assert_close(out["teacher_logprobs"][row][mask], alone["teacher_logprobs"][0][mask])
    other = group.worker("teacher[src/a]").compute_teacher_logprobs(batch.index([0]))  # the wrong teacher differs
    assert not torch.allclose(out["teacher_logprobs"][0][:2], other["teacher_logprobs"][0][:2])
