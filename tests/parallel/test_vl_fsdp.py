"""FSDP2 over a Qwen2.5-VL actor on 2 gloo ranks, padded and packed forward, with the vision tower trained, frozen or
under a LoRA actor: every vision block and decoder layer is
its own FSDP group, the weights are read shard by shard, and log-probs of each rank's rows and the weights after one
PPO update equal the single-process run's."""

from __future__ import annotations

import pytest
import torch

from npu_rl.models.synthetic import save_random_vl_model
from tests.workers.test_vl_actor import _rollout_batch


def _worker(folder: str, out_dir: str, remove_padding: bool, extra: tuple = ()):
    from tests.models.lora.common import actor_config, actor_worker

    config = actor_config(folder, out_dir, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                          "data.max_prompt_length=128", "actor_rollout_ref.actor.ppo_mini_batch_size=3",
                          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.rollout.n=2",
                          "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.shuffle=False",
                          f"actor_rollout_ref.model.use_remove_padding={remove_padding}", *extra)
    worker = actor_worker(config)
    worker.init_model(total_training_steps=1)
    return worker


def step_job(folder: str, out_dir: str, remove_padding: bool = False, extra: tuple = ()) -> dict:
    """This rank's half of the rows: log-probs, then one update; the full weights after it."""
    from npu_rl.parallel import dist
    from npu_rl.parallel.fsdp import fsdp_modules
    from npu_rl.parallel.weights import iter_full_parameters
    from npu_rl.protocol import Batch

    worker = _worker(folder, out_dir, remove_padding, extra)
    batch = _rollout_batch(folder)
    rank, world = dist.rank(), dist.world_size()
    per_rank = len(batch) // world
    mine = batch.split(per_rank)[rank] if world > 1 else batch
    logprobs = worker.compute_logprobs(mine)["old_logprobs"]
    metrics = worker.update_policy(mine.union(Batch({"old_logprobs": logprobs}))).metrics
    groups = sorted({type(m).__name__ for m in fsdp_modules(worker.model)}) if world > 1 else []
    return {"logprobs": logprobs, "groups": groups, "metrics": metrics,
            "full": {n: t.detach().clone() for n, t in iter_full_parameters(worker.model, include_tied=True)}}


FROZEN = ("actor_rollout_ref.actor.freeze_vision_tower=True",)
LORA = ("actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8")
# update micro-batches of 2 rows: a prompt's 2 samples together in some (the tower computes one image for the two:
# npu_rl/models/vision_dedup.py), a row of each of two prompts in others
PAIRS = ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",)


@pytest.mark.parametrize("remove_padding,extra", [(False, ()), (True, ()), (False, FROZEN), (True, LORA),
                                                  (True, PAIRS)],
                         ids=["padded", "packed", "frozen-tower", "lora", "tower-dedup"])
def test_two_ranks_equal_one(dist_pool2, dist_pool1, tmp_path, remove_padding, extra):
    """With a frozen tower (freeze_vision_tower, or LoRA on the language model) the update's one vision forward per
    pass runs as a forward of the FSDP2 root on both ranks. With micro-batches of 2 rows the trained tower computes
    a micro-batch's shared image once: rows 0-1, 2-3, 4-5 (3 prompts x n=2) on one rank; of two ranks, rank 0's
    0-1 (then 2) and none of rank 1's 3-4, 5."""
    folder = save_random_vl_model(str(tmp_path / "vl"))
    one = dist_pool1.run(step_job, folder, str(tmp_path / "one"), remove_padding, extra)[0]
    two = dist_pool2.run(step_job, folder, str(tmp_path / "two"), remove_padding, extra)
    root = "FSDPPeftModelForCausalLM" if extra == LORA else "FSDPQwen2_5_VLForConditionalGeneration"
    assert {"FSDPQwen2_5_VLVisionBlock", "FSDPQwen2_5_VLDecoderLayer", root} <= set(two[0]["groups"])
    torch.testing.assert_close(torch.cat([two[0]["logprobs"], two[1]["logprobs"]]), one["logprobs"],
                               rtol=1e-5, atol=1e-6)
    assert one["full"].keys() == two[0]["full"].keys()
    # the 2-rank weights are read shard by shard from a file in the legacy layout (model.layers.*, visual.*): a
    # name not found would be initialised fresh and differ here
    for name, value in one["full"].items():
        torch.testing.assert_close(two[0]["full"][name], value, rtol=1e-4, atol=1e-5, msg=name)
    deduplicated = "actor/vision/images_deduplicated"
    counts = (one["metrics"][deduplicated], two[0]["metrics"][deduplicated], two[1]["metrics"][deduplicated])
    # one row a micro-batch, or the frozen tower's features: no tower call is handed a copy
    assert counts == ((3, 1, 0) if extra == PAIRS else (0, 0, 0))


def rollout_job(folder: str, out_dir: str) -> dict:
    """The hf engine on the FSDP2 actor (full weights gathered once, a hook-free twin decodes): this rank's prompts,
    greedy, with each prompt's images encoded once and with the pixels repeated per sample."""
    from npu_rl.data.dataset import PromptDataset
    from npu_rl.data.loader import PromptCollator
    from npu_rl.data.builtin import resolve_builtin
    from npu_rl.models.loader import load_tokenizer
    from npu_rl.models.vision import load_vision_inputs
    from npu_rl.parallel import dist
    from npu_rl.rollout import SamplingParams
    from npu_rl.rollout.hf import HFRolloutEngine

    worker = _worker(folder, out_dir, False)
    tokenizer, vision = load_tokenizer(folder), load_vision_inputs(folder)
    data = PromptDataset(resolve_builtin("builtin://shapes/train?num_train=8&num_test=2&size=64"), tokenizer,
                         vision=vision, max_prompt_length=128)
    rank, world = dist.rank(), dist.world_size()
    rows = [data[i] for i in range(4)][rank * 4 // world:(rank + 1) * 4 // world]
    prompts = PromptCollator(tokenizer.pad_token_id, vision)(rows)
    engine = HFRolloutEngine(worker.model, tokenizer.pad_token_id)
    sampling = SamplingParams(n=2, temperature=0.0, max_new_tokens=5, stop_token_ids=[tokenizer.eos_token_id],
                              return_logprobs=True)
    out = {}
    for once in (True, False):
        engine.encode_images_once = once
        batch = engine.generate(prompts, sampling).batch
        out[once] = {"responses": batch["responses"], "logprobs": batch["rollout_logprobs"]}
    return out


def test_rollout_on_two_ranks_encodes_once(dist_pool2, dist_pool1, tmp_path):
    folder = save_random_vl_model(str(tmp_path / "vl"), seed=2)
    one = dist_pool1.run(rollout_job, folder, str(tmp_path / "one"))[0]
    two = dist_pool2.run(rollout_job, folder, str(tmp_path / "two"))
    for once in (True, False):
        torch.testing.assert_close(torch.cat([two[0][once]["responses"], two[1][once]["responses"]]),
                                   one[once]["responses"], rtol=0, atol=0)
        torch.testing.assert_close(torch.cat([two[0][once]["logprobs"], two[1][once]["logprobs"]]),
                                   one[once]["logprobs"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(one[True]["responses"], one[False]["responses"], rtol=0, atol=0)
    torch.testing.assert_close(one[True]["logprobs"], one[False]["logprobs"], rtol=1e-5, atol=1e-5)
