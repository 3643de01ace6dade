"""A Qwen2.5-VL actor on the engine: log-probs of a rollout batch of the shipped visual task (micro-batched, images
per row) equal one plain forward, and a PPO update moves the vision tower as well as the language model."""

import pytest
import torch

from npu_rl.data.builtin import resolve_builtin
from npu_rl.data.dataset import PromptDataset
from npu_rl.data.loader import PromptCollator
from npu_rl.models.forward import response_logprobs
from npu_rl.models.synthetic import save_random_vl_model
from npu_rl.models.vision import load_vision_inputs, multi_modal_kwargs
from npu_rl.models.vision_dedup import installed_tower_dedup
from npu_rl.protocol import Batch
from npu_rl.rollout.utils import assemble_rollout_batch
from tests.models.lora.common import actor_config, actor_worker


def _rollout_batch(folder: str, num_prompts: int = 3, n: int = 2, response: int = 6) -> Batch:
    vision = load_vision_inputs(folder)
    from npu_rl.models.loader import load_tokenizer

    tokenizer = load_tokenizer(folder)
    data = PromptDataset(resolve_builtin("builtin://shapes/train?num_train=8&num_test=2&size=64"), tokenizer,
                         vision=vision, max_prompt_length=128)
    prompts = PromptCollator(tokenizer.pad_token_id, vision)([data[i] for i in range(num_prompts)])
    g = torch.Generator().manual_seed(0)
    rows = num_prompts * n
    responses = torch.randint(3, 100, (rows, response), generator=g)
    mask = torch.ones(rows, response, dtype=torch.long)
    mask[1::3, -2:] = 0
    batch = assemble_rollout_batch(prompts, responses, mask, n, tokenizer.pad_token_id)
    return batch.union(Batch({"ref_logprobs": -torch.rand(rows, response, generator=g) * mask,
                              "advantages": torch.randn(rows, response, generator=g) * mask}))


@pytest.mark.parametrize("remove_padding", [False, True])
def test_vl_actor_logprobs_and_update(tmp_path, remove_padding):
    folder = save_random_vl_model(str(tmp_path / "vl"))
    config = actor_config(folder, str(tmp_path / "run"),
                          "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", "data.max_prompt_length=128",
                          f"actor_rollout_ref.model.use_remove_padding={remove_padding}")
    worker = actor_worker(config)
    worker.init_model(total_training_steps=1)
    batch = _rollout_batch(folder)
    assert batch["position_ids"].dim() == 3
    out = worker.compute_logprobs(batch)
    assert worker.engine.runner.packed == remove_padding
    with torch.no_grad():  # one padded forward of the whole batch (the packed model still runs padded batches)
        expected, _ = response_logprobs(worker.model, batch["input_ids"], batch["attention_mask"],
                                        batch["position_ids"], batch["responses"], 1.0,
                                        model_inputs=multi_modal_kwargs(batch.non_tensors["multi_modal_inputs"], "cpu"))
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(out["old_logprobs"][mask], expected[mask], rtol=1e-5, atol=1e-6)
    before = {k: v.detach().clone() for k, v in worker.model.state_dict().items()}
    metrics = worker.update_policy(batch.union(Batch({"old_logprobs": out["old_logprobs"]}))).metrics
    assert torch.isfinite(torch.as_tensor(float(metrics["actor/pg_loss"])))
    after = worker.model.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert any(k.startswith("model.visual.blocks.") for k in moved), sorted(moved)[:5]
    assert any(k.startswith("model.language_model.layers.") for k in moved)


class _CountCalls:
    def __init__(self, module):
        self.calls = 0
        module.register_forward_hook(lambda *_: setattr(self, "calls", self.calls + 1))


def test_vl_actor_encodes_each_prompt_once(tmp_path):
    """2 prompts x n=4 samples in micro-batches of 2 rows: the log-prob pass runs the vision tower once (the plain
    path: once per micro-batch) with equal log-probs (1e-5, fp32). With actor.freeze_vision_tower the update
    encodes once too and trains the language model exactly as the plain path does, the vision tower untouched;
    without it every micro-batch's forward runs the tower (its gradient is wanted)."""
    folder = save_random_vl_model(str(tmp_path / "vl"))
    batch = _rollout_batch(folder, num_prompts=2, n=4)
    results = {}
    for once in (True, False):
        config = actor_config(folder, str(tmp_path / f"run{once}"),
                              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                              "data.max_prompt_length=128", "actor_rollout_ref.actor.freeze_vision_tower=True")
        worker = actor_worker(config)
        worker.init_model(total_training_steps=1)
        worker.engine.encode_images_once = once
        counter = _CountCalls(worker.engine.compute_model.model.visual)
        out = worker.compute_logprobs(batch)
        logprob_calls = counter.calls
        before = {k: v.detach().clone() for k, v in worker.model.state_dict().items()}
        worker.update_policy(batch.union(Batch({"old_logprobs": out["old_logprobs"]})))
        after = worker.model.state_dict()
        results[once] = (out["old_logprobs"], logprob_calls, counter.calls - logprob_calls, before, after)
    (cached, calls, update_calls, before, after), (plain, plain_calls, plain_update_calls, _, plain_after) = \
        results[True], results[False]
    assert (calls, update_calls) == (1, 1)
    assert (plain_calls, plain_update_calls) == (4, 4)  # 8 rows / 2 per micro-batch, in each pass
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(cached[mask], plain[mask], rtol=1e-5, atol=1e-6)
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and not any(k.startswith("model.visual.") for k in moved)
    for key in before:
        torch.testing.assert_close(after[key], plain_after[key], rtol=1e-4, atol=1e-6)


class _ComputedPatches:
    """The patches the vision tower computes, per call: what its patch embedding receives (a hook)."""

    def __init__(self, model):
        self.calls: list[int] = []
        model.model.visual.patch_embed.register_forward_pre_hook(lambda _, args: self.calls.append(len(args[0])))


def _patches(rows) -> int:
    return sum(len(row["pixel_values"]) for row in rows if row)


class _StepGradients:
    """The gradients the optimizer steps on, by parameter name, at each step (an optimizer step pre-hook)."""

    def __init__(self, engine):
        self.steps: list[dict[str, torch.Tensor]] = []
        names = {id(p): name for name, p in engine.model.named_parameters()}
        engine.optimizer.register_step_pre_hook(lambda optimizer, *_: self.steps.append(
            {names[id(p)]: p.grad.clone() for group in optimizer.param_groups for p in group["params"]
             if p.grad is not None}))


def test_vl_actor_update_runs_the_vision_tower_per_micro_batch_when_it_trains(tmp_path):
    """The log-prob pass encodes each prompt once (transformers >= 5.19's features, no dedup plan involved); the
    update of a trained tower runs it in every micro-batch, on the micro-batch's distinct images only."""
    folder = save_random_vl_model(str(tmp_path / "vl"))
    batch = _rollout_batch(folder, num_prompts=2, n=4)
    config = actor_config(folder, str(tmp_path / "run"), "data.max_prompt_length=128")
    worker = actor_worker(config)
    worker.init_model(total_training_steps=1)
    counter = _CountCalls(worker.engine.compute_model.model.visual)
    computed = _ComputedPatches(worker.engine.compute_model)
    old = worker.compute_logprobs(batch)["old_logprobs"]
    rows = batch.non_tensors["multi_modal_inputs"]
    assert counter.calls == 1 and computed.calls == [_patches([rows[0], rows[4]])]
    assert installed_tower_dedup(worker.engine.compute_model) is None  # encoded once: no pixels, no plan
    metrics = worker.update_policy(batch.union(Batch({"old_logprobs": old}))).metrics
    assert counter.calls == 1 + 4
    # 4 micro-batches of 2 rows, each from one prompt: one image computed per micro-batch, not 2
    assert computed.calls[1:] == [_patches([rows[0]]), _patches([rows[2]]), _patches([rows[4]]), _patches([rows[6]])]
    assert metrics["actor/vision/images_deduplicated"] == 4


@pytest.mark.parametrize("remove_padding", [False, True])
def test_vl_actor_with_and_without_the_tower_dedup(tmp_path, monkeypatch, remove_padding):
    """``NPU_RL_VISION_DEDUP`` on and off, on the pixel paths (a log-prob pass without the encode-once features,
    as with transformers < 5.19, and the update of a trained tower), in micro-batches of 3 rows that cut through
    the prompts' 4 samples: equal log-probs and equal gradients at the optimizer step, every parameter's (1e-5 of
    its largest, fp32), and with it on the tower computes each micro-batch's distinct images only. (The weights after
    the step are not compared: Adam at lr 1e-2 magnifies gradient entries near zero, 2e-5 apart here.)"""
    folder = save_random_vl_model(str(tmp_path / "vl"))
    batch = _rollout_batch(folder, num_prompts=2, n=4)
    rows = batch.non_tensors["multi_modal_inputs"]
    results = {}
    for switch in ("0", "1"):
        monkeypatch.setenv("NPU_RL_VISION_DEDUP", switch)
        config = actor_config(folder, str(tmp_path / f"run{switch}"), "data.max_prompt_length=128",
                              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3",
                              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
                              f"actor_rollout_ref.model.use_remove_padding={remove_padding}")
        worker = actor_worker(config)
        worker.init_model(total_training_steps=1)
        worker.engine.encode_images_once = False
        computed = _ComputedPatches(worker.engine.compute_model)
        out = worker.compute_logprobs(batch)
        logprob_calls = list(computed.calls)
        grads = _StepGradients(worker.engine)
        metrics = worker.update_policy(batch.union(Batch({"old_logprobs": out["old_logprobs"]}))).metrics
        results[switch] = (out["old_logprobs"], logprob_calls, computed.calls[len(logprob_calls):], metrics,
                           grads.steps)
    (plain, plain_calls, plain_update, plain_metrics, plain_grads) = results["0"]
    (ours, calls, update_calls, metrics, grads) = results["1"]
    every_row = [_patches(rows[0:3]), _patches(rows[3:6]), _patches(rows[6:8])]
    distinct = [_patches([rows[0]]), _patches([rows[3], rows[4]]), _patches([rows[6]])]
    assert plain_calls == plain_update == every_row
    assert calls == update_calls == distinct
    assert plain_metrics["actor/vision/images_deduplicated"] == 0
    assert metrics["actor/vision/images_deduplicated"] == 8 - 4
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(ours[mask], plain[mask], rtol=1e-5, atol=1e-6)
    assert metrics["actor/pg_loss"] == pytest.approx(plain_metrics["actor/pg_loss"], rel=1e-5, abs=1e-7)
    assert len(grads) == len(plain_grads) == 1  # one mini-batch: one optimizer step
    assert any(name.startswith("model.visual.blocks.") for name in grads[0])
    assert grads[0].keys() == plain_grads[0].keys()
    for name, grad in grads[0].items():
        scale = plain_grads[0][name].abs().max().clamp(min=1e-6)
        torch.testing.assert_close(grad / scale, plain_grads[0][name] / scale, rtol=1e-5, atol=1e-5, msg=name)
