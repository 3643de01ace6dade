"""LoRA checkpoints and `npu-rl merge` against careless or hostile input: the manifest covers the adapter and merge
verifies it; unusable adapter values and config files are refused where loaded, named; a resume with another
lora_rank names the key; merge never writes into a folder it did not make (unless --force), never half."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from npu_rl.cli import main as cli
from npu_rl.models.lora import LoraConfigError, check_adapter_values, read_adapter_config
from npu_rl.trainer.main_ppo import main as train
from tests.models.lora.common import LORA
from tests.trainer.conftest import base_overrides


def _overrides(model_dir, run_dir, reward_file, *extra):
    return base_overrides(model_dir, run_dir, reward_file) + [
        "preset=grpo", "trainer.val_before_train=False", "trainer.save_freq=1", *LORA, *extra]


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, tmp_path_factory):
    from tests.trainer.conftest import REWARD_FN

    root = tmp_path_factory.mktemp("lora_run")
    reward = root / "reward.py"
    reward.write_text(REWARD_FN)
    run_dir = str(root / "run")
    assert train(_overrides(tiny_model_dir, run_dir, str(reward), "trainer.total_training_steps=1")) == 0
    return run_dir, str(reward)


def test_the_manifest_lists_the_adapter_and_merge_verifies_it(lora_run, tmp_path, capsys):
    run_dir, _ = lora_run
    actor = os.path.join(run_dir, "global_step_1", "actor")
    with open(os.path.join(actor, "manifest.json")) as f:
        listed = json.load(f)["files"]
    assert {"lora_adapter/adapter_config.json", "lora_adapter/adapter_model.safetensors"} <= set(listed)
    copy = str(tmp_path / "run")
    shutil.copytree(run_dir, copy)
    weights = os.path.join(copy, "global_step_1", "actor", "lora_adapter", "adapter_model.safetensors")
    with open(weights, "r+b") as f:  # one byte changed in the tensor data: same size
        f.seek(-3, os.SEEK_END)
        byte = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x40]))
    capsys.readouterr()
    assert cli(["merge", copy, "--out", str(tmp_path / "merged")]) == 2
    assert f"{weights} is corrupt" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "merged")


def test_merge_refuses_a_non_empty_out_and_never_leaves_half_a_model(lora_run, tmp_path, capsys, monkeypatch):
    run_dir, _ = lora_run
    other = tmp_path / "other_model"
    other.mkdir()
    (other / "config.json").write_text('{"mine": 1}')
    assert cli(["merge", run_dir, "--out", str(other)]) == 2
    assert "is not empty" in capsys.readouterr().err and (other / "config.json").read_text() == '{"mine": 1}'

    import npu_rl.models.lora as lora_module  # the merge of a LoRA run writes through its save_hf_state_dict

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(lora_module, "save_hf_state_dict", broken)
    with pytest.raises(OSError):
        cli(["merge", run_dir, "--out", str(other), "--force"])
    assert sorted(os.listdir(other)) == ["config.json"] and sorted(os.listdir(tmp_path)) == ["other_model"]
    monkeypatch.undo()
    assert cli(["merge", run_dir, "--out", str(other), "--force"]) == 0
    assert os.path.isfile(other / "model.safetensors") and not os.path.exists(other / "config.json.mine")
    assert json.loads((other / "config.json").read_text()).get("mine") is None
    assert sorted(os.listdir(tmp_path)) == ["other_model"]  # no staging folder left beside it


def test_resume_with_another_lora_rank_names_the_key(lora_run, tiny_model_dir, tmp_path, capsys):
    run_dir, reward = lora_run
    copy = str(tmp_path / "run")
    shutil.copytree(run_dir, copy)
    code = train(_overrides(tiny_model_dir, copy, reward, "trainer.total_training_steps=2",
                            "trainer.resume_mode=auto", "actor_rollout_ref.model.lora_rank=8"))
    assert code == 2
    err = capsys.readouterr().err
    assert "actor_rollout_ref.model.lora_rank=8, but the checkpoint" in err and "lora_rank=4" in err


def _adapter(folder, **config):
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": 2, "lora_alpha": 4, **config}, f)
    tensors = {"base_model.model.layer.lora_A.weight": torch.ones(2, 3),
               "base_model.model.layer.lora_B.weight": torch.ones(3, 2)}
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    return str(folder), tensors


def test_non_finite_adapter_weights_and_scales_are_refused_naming_the_file(tmp_path):
    from safetensors.torch import save_file

    path, tensors = _adapter(tmp_path / "ok")
    check_adapter_values(path, read_adapter_config(path))
    tensors["base_model.model.layer.lora_B.weight"][1, 1] = float("nan")
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    with pytest.raises(LoraConfigError, match=r"adapter_model.safetensors: tensor 'base_model.model.layer.lora_B."
                                              r"weight' holds NaN"):
        check_adapter_values(path, read_adapter_config(path))
    path, tensors = _adapter(tmp_path / "huge")  # a usable lora_alpha, weights whose product is past float32
    save_file({k: v * 1e20 for k, v in tensors.items()}, os.path.join(path, "adapter_model.safetensors"))
    with pytest.raises(LoraConfigError, match="past float32's range"):
        check_adapter_values(path, read_adapter_config(path))


@pytest.mark.parametrize("content, words", [
    ('{"peft_type": "LORA", "r": 2, "lora_alpha": NaN}', "lora_alpha=nan must be a finite number"),
    ('{"peft_type": "LORA", "r": 0}', "r=0 must be a positive integer"),
    ('{"peft_type": "LORA", "r": 2,', "cannot be read as JSON"),
    # issue 39: accepted before (B is zero at the start, so the weights did not show it), or a raw KeyError
    ('{"peft_type": "LORA", "r": 8, "lora_alpha": 1e30}', "lora_alpha=1e\\+30 with r=8 scales the adapter's update"),
    ('{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "modules_to_save": ["lm_head"]}',
     r"modules_to_save=\['lm_head'\] \(whole layers trained beside the adapter\) is not supported"),
    (b"\xff\xfe\x00garbage", "cannot be read as JSON"),
])
def test_an_unreadable_adapter_config_is_named(tmp_path, content, words):
    path, _ = _adapter(tmp_path / "a")
    config_file = os.path.join(path, "adapter_config.json")
    with open(config_file, "wb") as f:
        f.write(content.encode() if isinstance(content, str) else content)
    with pytest.raises(LoraConfigError, match=words) as info:
        read_adapter_config(path)
    assert config_file in str(info.value)
