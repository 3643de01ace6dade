"""A teacher or a reward model on a pool of its own (``distillation.nnodes`` / ``reward_model.enable_resource_pool``):
run over 2 gloo ranks, its weights sharded with FSDP2 over them and the rows split between them the way its worker
group splits them (odd row counts padded, the copies dropped), it gives what the 1-rank in-process worker gives
(fp32, tiny models)."""

from __future__ import annotations

import pytest
import torch

from npu_rl.config.loader import load_config
from npu_rl.controller.dispatch import Dispatch, collect_outputs, pad_rows, split_inputs, trim_rows
from npu_rl.controller.worker_group import WorkerSpec, layout_of
from npu_rl.parallel import dist
from npu_rl.protocol import Batch
from npu_rl.trainer.preflight import run_settings_for
from npu_rl.workers.roles import own_pools, worker_specs
from tests.trainer.conftest import base_overrides

_WORKERS: dict[str, object] = {}  # on each rank of the pool: the worker built by _init


def _init(spec: WorkerSpec, role: str):
    worker = spec.build()
    worker.init_model()
    _WORKERS[role] = worker
    shards = [p for p in worker.engine.compute_model.parameters()]
    local = sum(getattr(p, "to_local", lambda: p)().numel() for p in shards)
    return layout_of(worker, dist.rank(), dist.world_size()), local


def _call(role: str, method: str, per_rank: list):
    args, kwargs = per_rank[dist.rank()]
    return getattr(_WORKERS[role], method)(*args, **kwargs)


def _batch(num_rows: int) -> Batch:
    """Prompts left-padded to 4, responses right-padded to 3, of different lengths."""
    g = torch.Generator().manual_seed(11)
    prompts = torch.randint(3, 40, (num_rows, 4), generator=g)
    responses = torch.randint(3, 40, (num_rows, 3), generator=g)
    prompt_lengths = torch.tensor([2, 3, 4, 1, 3][:num_rows])
    response_lengths = torch.tensor([2, 1, 3, 3, 2][:num_rows])
    prompt_mask = (torch.arange(4) >= 4 - prompt_lengths[:, None]).long()
    response_mask = (torch.arange(3) < response_lengths[:, None]).long()
    prompts, responses = prompts * prompt_mask, responses * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], 1)
    return Batch({"prompts": prompts, "responses": responses, "response_mask": response_mask,
                  "input_ids": torch.cat([prompts, responses], 1), "attention_mask": attention_mask,
                  "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0)})


def _pool_equals_one_rank(pool, spec: WorkerSpec, role: str, method: str, batch: Batch) -> tuple[Batch, Batch]:
    """(what the 2 ranks return, gathered as the group gathers it; what one in-process worker returns)."""
    ranks = pool.run(_init, spec, role)
    layouts = [layout for layout, _ in ranks]
    assert [lay.dp_size for lay in layouts] == [2, 2]
    args, kwargs, rows = pad_rows((batch,), {}, layouts[0].dp_size)
    per_rank = split_inputs(Dispatch.DP_SPLIT, 2, layouts, args, kwargs)
    pooled = trim_rows(collect_outputs(Dispatch.DP_SPLIT, layouts, pool.run(_call, role, method, per_rank)), rows)
    local = spec.build()
    local.init_model()
    whole = sum(p.numel() for p in local.engine.compute_model.parameters())
    assert all(0 < shard < whole for _, shard in ranks), (ranks, whole)  # each rank holds part of the weights
    return pooled, getattr(local, method)(batch)


@pytest.mark.parametrize("topk", [0, 3])
def test_teacher_logprobs_from_a_two_rank_pool_equal_one_rank(tiny_model_dir, tmp_path, dist_pool2, topk):
    from tests.helpers import save_tiny_model_dir

    teacher = save_tiny_model_dir(str(tmp_path / "teacher"), seed=5)
    loss = (["distillation.distillation_loss.loss_mode=forward_kl_topk", f"distillation.distillation_loss.topk={topk}"]
            if topk else [])
    config = load_config(base_overrides(tiny_model_dir, str(tmp_path / "run")) + [
        "preset=grpo", "distillation.enabled=True", f"distillation.teacher_models.teacher_model.model_path={teacher}",
        "distillation.nnodes=1", "distillation.n_gpus_per_node=2",
        "distillation.teacher_models.teacher_model.fsdp_config.mixed_precision.param_dtype=fp32",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "data.max_response_length=3"] + loss)
    assert own_pools(config)["teacher"].world_size == 2
    spec = worker_specs(config, run_settings_for(config))["teacher"]
    pooled, local = _pool_equals_one_rank(dist_pool2, spec, "teacher", "compute_teacher_logprobs", _batch(5))
    assert len(pooled) == 5  # 5 rows over 2 ranks: padded to 6, the copy dropped
    keys = ["teacher_logprobs"] + (["teacher_topk_logprobs", "teacher_topk_ids"] if topk else [])
    assert sorted(pooled.keys()) == sorted(local.keys()) == sorted(keys)
    mask = _batch(5)["response_mask"].bool()
    torch.testing.assert_close(pooled["teacher_logprobs"][mask], local["teacher_logprobs"][mask])
    if topk:
        assert torch.equal(pooled["teacher_topk_ids"][mask], local["teacher_topk_ids"][mask])
        torch.testing.assert_close(pooled["teacher_topk_logprobs"][mask], local["teacher_topk_logprobs"][mask])


def test_reward_model_scores_from_a_two_rank_pool_equal_one_rank(tiny_model_dir, tmp_path, dist_pool2):
    from transformers import Qwen2ForSequenceClassification

    from tests.helpers import make_tiny_model, make_tiny_tokenizer

    rm_dir = str(tmp_path / "rm")
    model_config = make_tiny_model().config
    model_config.num_labels = 1
    torch.manual_seed(3)
    Qwen2ForSequenceClassification(model_config).save_pretrained(rm_dir)
    make_tiny_tokenizer().save_pretrained(rm_dir)
    config = load_config(base_overrides(tiny_model_dir, str(tmp_path / "run")) + [
        "preset=grpo", "reward_model.enable=True", f"reward_model.model.path={rm_dir}",
        "reward_model.enable_resource_pool=True", "reward_model.nnodes=1", "reward_model.n_gpus_per_node=2",
        "reward_model.model.fsdp_config.mixed_precision.param_dtype=fp32", "reward_model.micro_batch_size_per_gpu=2"])
    assert own_pools(config)["reward_model"].world_size == 2
    spec = worker_specs(config, run_settings_for(config))["reward_model"]
    pooled, local = _pool_equals_one_rank(dist_pool2, spec, "reward_model", "compute_rm_scores", _batch(5))
    assert len(pooled) == 5
    torch.testing.assert_close(pooled["rm_scores"], local["rm_scores"])
    torch.testing.assert_close(pooled["token_level_scores"], local["token_level_scores"])
