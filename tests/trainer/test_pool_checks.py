"""A teacher or a reward model on devices of its own: which roles go there, and what validation refuses
(npu_rl/trainer/checks/pools.py), each problem naming the keys."""

from __future__ import annotations

import pytest

from npu_rl.config.errors import ConfigError
from npu_rl.config.loader import load_config
from npu_rl.trainer.checks.pools import pool_device_problems, pool_problems
from npu_rl.trainer.preflight import load_checked
from npu_rl.workers.roles import OwnPool, own_pools
from tests.trainer.conftest import base_overrides


def _overrides(model_dir, tmp_path, *extra):
    return base_overrides(model_dir, str(tmp_path / "run")) + ["algorithm.adv_estimator=grpo", *extra]


def _distil(model_dir, *extra):
    return ["distillation.enabled=True", f"distillation.teacher_models.teacher_model.model_path={model_dir}", *extra]


def test_which_roles_run_on_a_pool_of_their_own(tiny_model_dir, tmp_path):
    shared = load_config(_overrides(tiny_model_dir, tmp_path, *_distil(tiny_model_dir)))
    assert own_pools(shared) == {}  # distillation.nnodes=0 (npu-rl's default): beside the actor
    config = load_config(_overrides(tiny_model_dir, tmp_path, *_distil(
        tiny_model_dir, "distillation.nnodes=2", "distillation.n_gpus_per_node=4"),
        "reward_model.enable=True", "reward_model.enable_resource_pool=True", "reward_model.nnodes=1",
        "reward_model.n_gpus_per_node=1"))
    pools = own_pools(config)
    assert pools["teacher"] == OwnPool(2, 4, "distillation") and pools["teacher"].world_size == 8
    assert pools["reward_model"] == pools["judge"] == OwnPool(1, 1, "reward_model")
    # verl's reward.reward_model.* names land on the same keys
    aliased = load_checked(_overrides(tiny_model_dir, tmp_path, "reward.reward_model.enable=True",
                                      f"reward.reward_model.model_path={tiny_model_dir}",
                                      "reward.reward_model.enable_resource_pool=True", "reward.reward_model.nnodes=1",
                                      "reward.reward_model.n_gpus_per_node=2"), "ppo_trainer")
    assert own_pools(aliased)["judge"] == OwnPool(1, 2, "reward_model")


def test_a_pool_without_devices_is_refused_naming_its_keys(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"distillation: its own resource pool needs distillation.nnodes >= 1 and "
                                          r"distillation.n_gpus_per_node >= 1 \(got nnodes=1, n_gpus_per_node=0\)"):
        load_checked(_overrides(tiny_model_dir, tmp_path, *_distil(tiny_model_dir, "distillation.nnodes=1",
                                                                   "distillation.n_gpus_per_node=0")), "ppo_trainer")
    with pytest.raises(ConfigError, match=r"reward_model: its own resource pool needs reward_model.nnodes >= 1"):
        load_checked(_overrides(tiny_model_dir, tmp_path, "reward_model.enable=True",
                                f"reward_model.model.path={tiny_model_dir}", "reward_model.enable_resource_pool=True"),
                     "ppo_trainer")


def test_what_cannot_be_placed(tiny_model_dir, tmp_path):
    teacher3 = _distil(tiny_model_dir, "distillation.nnodes=1", "distillation.n_gpus_per_node=3")
    sp = load_config(_overrides(tiny_model_dir, tmp_path, *teacher3,
                                "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2"))
    assert any("distillation.nnodes=1 x distillation.n_gpus_per_node=3 = 3 devices) is not a multiple of "
               "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2" in p for p in pool_problems(sp))
    cpus = load_config(_overrides(tiny_model_dir, tmp_path, *teacher3, "ray_kwargs.ray_init.num_cpus=2"))
    # the trainer's one device runs in this process (controller auto); the teacher's 3 ranks are Ray actors
    assert pool_problems(cpus) == ["ray_kwargs.ray_init.num_cpus=2 is fewer than the 3 CPUs the run's Ray processes "
                                   "hold (one per rank: the teacher's 3 (distillation.nnodes=1 x "
                                   "distillation.n_gpus_per_node=3)): raise num_cpus or shrink a pool"]
    judge = load_config(_overrides(tiny_model_dir, tmp_path, "reward_model.enable=True",
                                   f"reward_model.model.path={tiny_model_dir}", "reward_model.rollout.name=vllm",
                                   "reward_model.enable_resource_pool=True", "reward_model.nnodes=1",
                                   "reward_model.n_gpus_per_node=2"))
    assert any("a vLLM judge runs on one device" in p for p in pool_problems(judge))
    prime = load_config(_overrides(tiny_model_dir, tmp_path, "reward_model.enable=True",
                                   "reward_model.reward_manager=prime", "reward_model.enable_resource_pool=True",
                                   "reward_model.nnodes=1", "reward_model.n_gpus_per_node=1"))
    assert any("PRIME's implicit PRM trains every step on the trainer's devices" in p for p in pool_problems(prime))


def test_pools_beside_the_trainer_on_one_node_must_fit_its_devices(tiny_model_dir, tmp_path):
    config = load_config(_overrides(tiny_model_dir, tmp_path, *_distil(
        tiny_model_dir, "distillation.nnodes=1", "distillation.n_gpus_per_node=4"), "trainer.n_gpus_per_node=6"))
    # 6 + 4 devices on a node of 8: refused, naming both keys
    (problem,) = pool_device_problems(config, "npu", 8, "ASCEND_RT_VISIBLE_DEVICES")
    assert problem.startswith("trainer.n_gpus_per_node=6 plus distillation.n_gpus_per_node=4 (teacher) = 10 devices, "
                              "but this node has 8 npu device(s)")
    assert pool_device_problems(config, "npu", 10, "ASCEND_RT_VISIBLE_DEVICES") == []
    (problem,) = pool_device_problems(config, "cuda", 2, "CUDA_VISIBLE_DEVICES")  # more per node than a node has
    assert problem.startswith("distillation.n_gpus_per_node=4 (the teacher's own pool) but only 2 cuda device(s)")
    shared = load_config(_overrides(tiny_model_dir, tmp_path, *_distil(tiny_model_dir), "trainer.n_gpus_per_node=8"))
    assert pool_device_problems(shared, "npu", 8, "ASCEND_RT_VISIBLE_DEVICES") == []
