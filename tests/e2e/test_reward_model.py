"""The model-based reward: scores equal a per-row forward of the sequence-classification model; a GRPO run uses it."""

from __future__ import annotations

import math

import pytest
import torch

from npu_rl.config.loader import load_config
from tests.trainer.conftest import base_overrides, run_training, step_rows


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> str:
    from transformers import Qwen2ForSequenceClassification

    from tests.helpers import make_tiny_model, make_tiny_tokenizer

    path = str(tmp_path_factory.mktemp("rm"))
    config = make_tiny_model().config
    config.num_labels = 1
    torch.manual_seed(3)
    Qwen2ForSequenceClassification(config).save_pretrained(path)
    make_tiny_tokenizer().save_pretrained(path)
    return path


def test_scores_equal_an_unpadded_forward(tiny_model_dir, rm_dir, tmp_path):
    from transformers import AutoModelForSequenceClassification

    from npu_rl.trainer.preflight import run_settings_for
    from npu_rl.protocol import Batch
    from npu_rl.workers.reward_model import RewardModelWorker

    config = load_config(base_overrides(tiny_model_dir, str(tmp_path)) + [
        "preset=grpo", "reward_model.enable=True", f"reward_model.model.path={rm_dir}",
        "reward_model.model.fsdp_config.mixed_precision.param_dtype=fp32", "reward_model.micro_batch_size_per_gpu=2"])
    worker = RewardModelWorker(config.reward_model, run_settings_for(config))
    worker.init_model()
    # Two rows: prompt left-padded to 4, response right-padded to 3.
    prompts = torch.tensor([[0, 0, 10, 11], [0, 12, 13, 14]])
    responses = torch.tensor([[20, 21, 0], [22, 0, 0]])
    prompt_mask = (prompts != 0).long()
    response_mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    batch = Batch({"prompts": prompts, "responses": responses, "response_mask": response_mask,
                   "input_ids": torch.cat([prompts, responses], 1),
                   "attention_mask": torch.cat([prompt_mask, response_mask], 1)})
    out = worker.compute_rm_scores(batch)
    reference = AutoModelForSequenceClassification.from_pretrained(rm_dir, num_labels=1).eval()
    for row, ids in enumerate([[10, 11, 20, 21], [12, 13, 14, 22]]):
        expected = reference(input_ids=torch.tensor([ids])).logits[0, 0]
        torch.testing.assert_close(out["rm_scores"][row], expected)
        last = int(response_mask[row].sum()) - 1
        assert out["token_level_scores"][row, last] == out["rm_scores"][row]
        assert out["token_level_scores"][row].count_nonzero() <= 1


def test_grpo_with_a_reward_model(tiny_model_dir, rm_dir, tmp_path):
    out = str(tmp_path / "run")
    assert run_training(base_overrides(tiny_model_dir, out) + [
        "preset=grpo", "reward_model.enable=True", f"reward_model.model.path={rm_dir}",
        "trainer.total_training_steps=2", "trainer.val_before_train=False"]) == 0
    rows = step_rows(out)
    assert math.isfinite(rows[2]["critic/score/mean"]) and rows[2]["critic/score/max"] > rows[2]["critic/score/min"]
