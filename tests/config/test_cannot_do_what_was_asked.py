"""Runs the schema accepts but that could not do what they ask are refused at validation with the reason: a
vision-language actor other than Qwen-VL or with options not built for it, bad image rows or image rows for a text
actor, a generative reward model (verl's FAPO recipe)."""

from __future__ import annotations

import json
import shutil

import pytest

from npu_rl.config.errors import ConfigError
from npu_rl.trainer.preflight import load_checked
from npu_rl.data.io import write_parquet
from npu_rl.data.images import image_bytes
from PIL import Image
from tests.trainer.conftest import base_overrides


def _config(model_dir, tmp_path, *extra):
    return load_checked(base_overrides(model_dir, str(tmp_path / "run")) + ["algorithm.adv_estimator=grpo"] + list(extra),
                       "ppo_trainer")


def _edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_a_vision_language_actor_is_refused(tiny_model_dir, tmp_path):
    vlm = shutil.copytree(tiny_model_dir, tmp_path / "vlm")
    _edit_config(vlm, architectures=["Qwen2_5_VLForConditionalGeneration"], vision_config={"depth": 2})
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.model.path: .*vlm is a vision-language model "
                                          r"\(Qwen2_5_VLForConditionalGeneration, model_type 'qwen2'\); npu-rl "
                                          r"trains the Qwen-VL family only"):
        _config(str(vlm), tmp_path)


def test_a_qwen_vl_actor_is_accepted_where_built(tmp_path):
    from npu_rl.models.synthetic import save_random_vl_model

    folder = save_random_vl_model(str(tmp_path / "qwen_vl"))
    shapes = ["data.train_files=builtin://shapes/train?num_train=8&num_test=2&size=56",
              "data.val_files=builtin://shapes/test?num_train=8&num_test=2&size=56"]
    _config(folder, tmp_path, *shapes, "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.model.use_remove_padding=True")
    _config(folder, tmp_path, *shapes, "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.limit_images=2")
    _config(folder, tmp_path, *shapes, "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.model.lora.merge=True")  # the merged weights go to vLLM
    with pytest.raises(ConfigError) as exc:
        _config(folder, tmp_path, *shapes, "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.model.lora_rank=8")
    message = str(exc.value)
    assert ("is a Qwen-VL model: a LoRA adapter served by vLLM (not tested with images) is not built for it yet; set "
            "actor_rollout_ref.model.lora.merge=True") in message
    _config(folder, tmp_path, *shapes, "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.model.lora_rank=8")
    _config(folder, tmp_path, *shapes, "actor_rollout_ref.rollout.name=hf", "data.image_patch_size=14")  # verl's
    with pytest.raises(ConfigError, match="data.image_patch_size=16, but .* uses patch_size=14"):
        _config(folder, tmp_path, *shapes, "actor_rollout_ref.rollout.name=hf", "data.image_patch_size=16")
    (tmp_path / "qwen_vl" / "preprocessor_config.json").unlink()
    with pytest.raises(ConfigError, match="without preprocessor_config.json"):
        _config(folder, tmp_path, *shapes, "actor_rollout_ref.rollout.name=hf")


def test_freeze_vision_tower_and_ulysses_with_a_qwen_vl_actor(tiny_model_dir, tmp_path):
    from npu_rl.models.synthetic import save_random_vl_model

    folder = save_random_vl_model(str(tmp_path / "qwen_vl"))
    shapes = ["data.train_files=builtin://shapes/train?num_train=8&num_test=2&size=56",
              "data.val_files=builtin://shapes/test?num_train=8&num_test=2&size=56", "actor_rollout_ref.rollout.name=hf"]
    config = _config(folder, tmp_path, *shapes, "actor_rollout_ref.actor.freeze_vision_tower=True")
    assert config.actor_rollout_ref.actor.freeze_vision_tower is True
    with pytest.raises(ConfigError, match=r"actor.freeze_vision_tower=True, but the actor .* is a text model"):
        _config(tiny_model_dir, tmp_path, "actor_rollout_ref.actor.freeze_vision_tower=True")
    _config(folder, tmp_path, *shapes, "actor_rollout_ref.model.lora_rank=8",  # verl's VL LoRA script's keys
            "actor_rollout_ref.model.target_modules=all-linear", "actor_rollout_ref.model.exclude_modules=.*visual.*")
    with pytest.raises(ConfigError, match=r"target_modules=\['nothing'\] .* matches no linear layer of "
                                          r"Qwen2_5_VLForConditionalGeneration"):
        _config(folder, tmp_path, *shapes, "actor_rollout_ref.model.lora_rank=8",
                "actor_rollout_ref.model.target_modules=[nothing]")
    for role in ("actor", "ref"):  # refused, naming the key (docs/vl.md: not built)
        with pytest.raises(ConfigError, match=rf"Ulysses \(actor_rollout_ref\.{role}\."
                                              r"ulysses_sequence_parallel_size=2: .*\) is not built"):
            _config(folder, tmp_path, *shapes, "trainer.n_gpus_per_node=2",
                    f"actor_rollout_ref.{role}.ulysses_sequence_parallel_size=2")


def test_image_rows_are_refused_naming_file_and_row(tiny_model_dir, tmp_path):
    text = {"data_source": "hiyouga/geometry3k", "prompt": [{"role": "user", "content": "<image>Find x."}],
            "reward_model": {"style": "rule", "ground_truth": "3"}}
    png = image_bytes(Image.new("RGB", (40, 30)))
    rows = [dict(text, images=[{"bytes": png, "path": None}]), dict(text, images=[{"bytes": b"\x89PNG", "path": None}]),
            dict(text, images=[{"bytes": png, "path": None}] * 2)]
    path = write_parquet(rows, str(tmp_path / "geo3k" / "train.parquet"))
    with pytest.raises(ConfigError) as exc:
        _config(tiny_model_dir, tmp_path, f"data.train_files={path}", "data.image_key=images")
    message = str(exc.value)
    assert f"data.train_files: {path}: row 1: images[0]: the image (4 bytes) cannot be read: not an image format" in message
    assert f"data.train_files: {path}: row 2: the prompt has 1 <image> tag(s) and 'images' has 2 image(s)" in message
    assert "data.train_files: rows carry images ('images') but the actor" in message  # a text actor
    assert f"{path}: row 0: " not in message
    write_parquet([dict(text, images=[])], path)  # an empty image list is a text row
    _config(tiny_model_dir, tmp_path, f"data.train_files={path}", "custom_reward_function.path=" + _reward(tmp_path))


def _reward(tmp_path, body="def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                          "    return 0.0\n") -> str:
    path = tmp_path / "reward.py"
    path.write_text(body)
    return str(path)


def test_a_generative_reward_model_is_served_as_a_judge(tiny_model_dir, tmp_path):
    from npu_rl.trainer.preflight import run_settings_for

    genrm = shutil.copytree(tiny_model_dir, tmp_path / "genrm")  # a causal LM: FAPO's GenRM is one
    rm = ["reward_model.enable=True", f"reward_model.model.path={genrm}"]
    assert run_settings_for(_config(tiny_model_dir, tmp_path, *rm)).reward_judge
    _edit_config(genrm, architectures=["Qwen2ForSequenceClassification"], num_labels=1)
    assert not run_settings_for(_config(tiny_model_dir, tmp_path, *rm)).reward_judge  # a classifier scores


def test_a_reward_function_calling_the_genrm_router_is_refused(tiny_model_dir, tmp_path):
    body = ("async def compute_score(data_source, solution_str, ground_truth, extra_info, reward_router_address,\n"
            "                        reward_model_tokenizer):\n    return 0.0\n")
    with pytest.raises(ConfigError, match="takes reward_router_address: it calls verl's generative reward model "
                                          "HTTP router.*passes it to a compute_score with a 'judge' parameter"):
        _config(tiny_model_dir, tmp_path, f"custom_reward_function.path={_reward(tmp_path, body)}")
