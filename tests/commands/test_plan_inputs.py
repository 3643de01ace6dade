"""``npu-rl plan`` checks its inputs as ``npu-rl train`` does before any arithmetic: 0 or a negative number of
devices, lengths <= 0, a micro-batch of 0, a tensor-parallel size that does not divide the devices are refused
naming the key (rc 2). Before (issue 39) it answered "fits" for each of them."""

from __future__ import annotations

import json
import os

import pytest

from npu_rl.commands.plan import main as plan


def _args(model_config, *overrides):  # a verl job (8 devices), no critic
    return ["--config-name", "ppo_trainer", "--device", "h200", "--model-config", model_config,
            "algorithm.adv_estimator=grpo", *overrides]


@pytest.fixture(scope="module")
def model_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan_model") / "config.json"
    path.write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936,
                                "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                                "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True,
                                "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}))
    return str(path)


@pytest.mark.parametrize("override, words", [
    ("trainer.n_gpus_per_node=0", "trainer.nnodes and trainer.n_gpus_per_node must be >= 1"),
    ("trainer.n_gpus_per_node=-8", "trainer.nnodes and trainer.n_gpus_per_node must be >= 1"),
    ("trainer.n_gpus_per_node=100000000000", "rows must divide evenly over 100000000000 data-parallel ranks"),
    ("data.max_prompt_length=-5", "data.max_prompt_length must be > 0"),
    ("data.max_response_length=0", "data.max_response_length must be > 0"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0", "ppo_micro_batch_size_per_gpu=0 must be > 0"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size=3", "tensor_model_parallel_size=3 must divide the 8"),
])
def test_inputs_training_refuses_are_refused_naming_the_key(model_config, capsys, override, words):
    assert plan(_args(model_config, override)) == 2
    captured = capsys.readouterr()
    assert words in captured.err and "fits" not in captured.out.lower(), (captured.out, captured.err)


@pytest.mark.parametrize("override", ["trainer.n_gpus_per_node=0", "trainer.nnodes=-1"])
def test_the_embedded_default_with_no_devices_is_refused_naming_the_key(capsys, override):
    """`npu-rl plan` plans the embedded default when no --config-name is given, as `npu-rl train` does; 0 devices
    there ended in a ZeroDivisionError in the micro-batch note before the checks could name the key."""
    assert plan(["--device", "h200", override]) == 2
    assert "trainer.nnodes and trainer.n_gpus_per_node must be >= 1" in capsys.readouterr().err


def test_no_config_name_plans_what_npu_rl_train_runs(capsys):
    """With no --config-name the plan is the embedded default's (SmolLM2-135M, 1 device), never verl's ppo_trainer
    default, whose model path (~/models/deepseek-llm-7b-chat) is on nobody's machine."""
    assert plan(["--device", "h200"]) == 0
    captured = capsys.readouterr()
    assert "1 device: fits" in captured.out and "deepseek" not in captured.out + captured.err, captured


def test_a_sound_config_is_still_planned(model_config, capsys):
    assert plan(_args(model_config)) in (0, 1)
    out = capsys.readouterr().out
    assert "FIT" in out.upper() and os.path.basename(model_config) not in out  # the verdict, not an error


@pytest.mark.parametrize("text, words", [
    ("[" * 100_000 + "]" * 100_000, r"is not a readable config.json \(RecursionError"),
    ("not json", r"is not a readable config.json \(JSONDecodeError"),
    ("[1, 2]", "holds a JSON list, not a model config"),
    ('{"model_type": "qwen2", "hidden_size": "big", "intermediate_size": 8, "num_hidden_layers": 2, '
     '"num_attention_heads": 2, "vocab_size": 10}', r"a size that is not a whole number \(ValueError"),
    ('{"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 8, "num_hidden_layers": -2, '
     '"num_attention_heads": 2, "vocab_size": 10}', "num_hidden_layers=-2 must be > 0"),
])
def test_a_deep_or_absurd_model_config_is_named_not_a_traceback(tmp_path, capsys, text, words):
    """issue 39: a config.json nested 100,000 deep ended in a RecursionError traceback."""
    path = tmp_path / "config.json"
    path.write_text(text)
    assert plan(["--device", "h200", "--model-config", str(path), "algorithm.adv_estimator=grpo"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"npu-rl plan: {path}") and "Traceback" not in err
    assert __import__("re").search(words, err), err


PLAN_DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "plan")


def test_plan_reads_verls_renamed_keys(tmp_path, capsys):
    """`npu-rl plan` takes the overrides `npu-rl train` takes: verl 0.9's reward.custom_reward_function.* included."""
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(open(os.path.join(PLAN_DATA, "qwen2.5-7b", "config.json")).read())
    code = plan(["--device", "h200", "algorithm.adv_estimator=grpo", f"actor_rollout_ref.model.path={model}",
                 f"reward.custom_reward_function.path={reward}"])
    captured = capsys.readouterr()
    assert code in (0, 1), captured.err
    assert "peak" in captured.out
