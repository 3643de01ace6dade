"""The same GRPO updates on 2 Ray workers (gloo, CPU) as in one process: dp=2, and Ulysses sp=2.

Rollouts are generated once, in-process, and fed to both worker groups, so the comparison is of the training path
(old log-probs, FSDP2-sharded updates, Ulysses attention, global loss denominators) on identical data. fp32
everywhere; the tolerances are those of float32 reductions in a different order.
"""

from __future__ import annotations


import pytest
import torch

from npu_rl.config.loader import load_config
from npu_rl.trainer.preflight import run_settings_for
from npu_rl.controller.worker_group import LocalWorkerGroup
from npu_rl.core import AdvantageInputs, compute_advantages
from npu_rl.data.loader import build_dataloader
from npu_rl.models.loader import load_tokenizer
from npu_rl.reward import build_reward_manager
from npu_rl.protocol import Batch
from npu_rl.trainer.sampling import score_batch
from npu_rl.workers.roles import worker_specs
from tests.trainer.conftest import base_overrides

pytestmark = [pytest.mark.ray, pytest.mark.dist]
STEPS = 2



def _config(model_dir, out_dir, reward_file, extra):
    return load_config(base_overrides(model_dir, out_dir, reward_file) + [
        # One mini-batch per step: with several, DP_SPLIT gives each rank a contiguous shard, so the rows of the i-th
        # mini-batch depend on the number of ranks (as in verl) and runs with different dp would differ.
        "preset=grpo", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.rollout.free_cache_engine=False", *extra])


def _ray_group(config, name):
    from npu_rl.controller.ray_group import RayWorkerGroup, ResourcePool

    pool = ResourcePool([2], resource=None, name=name)
    group = RayWorkerGroup(pool, worker_specs(config, run_settings_for(config)), env={"OMP_NUM_THREADS": "1"}, name=name)
    return pool, group


def _experience(config, group, loader_iter, tokenizer):
    """One step's batch: rollouts from ``group``, rule scores, GRPO advantages (the trainer's driver math)."""
    rollout = group.actor_rollout.generate_sequences(next(loader_iter)).batch
    rollout, _ = score_batch(rollout, build_reward_manager(config, tokenizer))
    out = compute_advantages(adv_estimator="grpo", inputs=AdvantageInputs(
        token_level_rewards=rollout["token_level_scores"], response_mask=rollout["response_mask"],
        index=rollout["uid"]))
    return rollout.union(Batch({"token_level_rewards": rollout["token_level_scores"], "advantages": out.advantages,
                                "returns": out.returns}))


def _weights(group, path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    group.actor_rollout.export_hf(path)
    return AutoModelForCausalLM.from_pretrained(path).state_dict()


@pytest.mark.parametrize("layout", ["dp2", "sp2"])
def test_two_ray_workers_match_one_process(layout, ray_session, tiny_model_dir, tmp_path, reward_file):
    extra = ["actor_rollout_ref.model.use_remove_padding=True"]
    single = _config(tiny_model_dir, str(tmp_path / "a"), reward_file, extra)
    if layout == "sp2":
        extra += ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"]
    config = _config(tiny_model_dir, str(tmp_path / "b"), reward_file, extra + ["trainer.n_gpus_per_node=2"])
    local, pool, ray_group = LocalWorkerGroup(worker_specs(single, run_settings_for(single))), None, None
    try:
        pool, ray_group = _ray_group(config, f"parity_{layout}")
        local.actor_rollout.init_model(STEPS)
        ray_group.actor_rollout.init_model(STEPS)
        tokenizer = load_tokenizer(tiny_model_dir)
        loader = iter(build_dataloader(single.data, tokenizer, "train"))
        for _ in range(STEPS):
            batch = _experience(single, local, loader, tokenizer)
            old_local = local.actor_rollout.compute_logprobs(batch)
            old_ray = ray_group.actor_rollout.compute_logprobs(batch)
            torch.testing.assert_close(old_ray["old_logprobs"], old_local["old_logprobs"], atol=2e-5, rtol=1e-5)
            batch = batch.union(old_local.select(["old_logprobs"]))
            m_local = local.actor_rollout.update_policy(batch).metrics
            m_ray = ray_group.actor_rollout.update_policy(batch).metrics
            for key in ("actor/pg_loss", "actor/grad_norm", "actor/pg_clipfrac"):
                assert m_ray[key] == pytest.approx(m_local[key], rel=1e-4, abs=1e-6), key
        w_local = _weights(local, str(tmp_path / "local_hf"))
        w_ray = _weights(ray_group, str(tmp_path / "ray_hf"))
    finally:
        if ray_group is not None:
            ray_group.shutdown()
        if pool is not None:
            pool.remove()
    assert w_local.keys() == w_ray.keys()
    for name in w_local:
        if name.endswith("k_proj.bias"):
            # Its gradient is exactly 0 (softmax ignores a shift shared by all keys); AdamW turns float noise of
            # either run into +-lr steps, so the two runs legitimately differ there.
            continue
        torch.testing.assert_close(w_ray[name], w_local[name], atol=2e-5, rtol=1e-4, msg=name)


def test_trainer_on_two_ray_workers_then_resume_on_one_process(ray_session, tiny_model_dir, tmp_path, reward_file):
    """The whole loop with the Ray controller (dp=2), then the checkpoint it wrote resumed in-process (dp=1)."""
    from tests.trainer.conftest import run_training, step_rows

    out = str(tmp_path / "run")
    common = base_overrides(tiny_model_dir, out, reward_file) + [
        "preset=grpo", "trainer.save_freq=2", "trainer.val_before_train=False", "trainer.resume_mode=auto"]
    assert run_training(common + ["trainer.n_gpus_per_node=2", "trainer.total_training_steps=2"]) == 0
    rows = step_rows(out)
    assert sorted(rows) == [1, 2]
    # Memory comes from each worker (the driver holds no device): both ranks report, the headline is their max.
    assert rows[2]["perf/num_memory_reports"] == 2
    per_rank = [rows[2][f"perf/rank{r}/cpu_memory_used_gb"] for r in (0, 1)]
    assert min(per_rank) > 0 and rows[2]["perf/cpu_memory_used_gb"] == max(per_rank)
    assert run_training(common + ["trainer.n_gpus_per_node=1", "trainer.total_training_steps=3"]) == 0
    rows = step_rows(out)
    assert sorted(rows) == [1, 2, 3] and rows[3]["actor/grad_norm"] > 0
