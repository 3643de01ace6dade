"""Every command that takes a model folder (train, doctor --parity, eval, merge) says what is wrong with a bad one in
the trainer's words (models/check.py): rc 2, the folder or file named, no traceback."""

from __future__ import annotations

import os
import shutil

import pytest

from npu_rl.cli import main as cli


def _bad_folder(kind: str, tiny_model_dir: str, tmp_path) -> str:
    path = tmp_path / kind
    if kind == "a_file":
        path.write_text("not a folder")
    elif kind == "empty":
        path.mkdir()
    else:
        shutil.copytree(tiny_model_dir, path)
        if kind == "invalid_config":
            (path / "config.json").write_text("{not json")
        elif kind == "truncated_weights":
            weights = path / "model.safetensors"
            size = os.path.getsize(weights)
            with open(weights, "r+b") as f:
                f.truncate(size // 2)
    return str(path)


WORDS = {"a_file": "is a file, not a model folder", "empty": "is empty", "invalid_config": "is not valid JSON",
         "truncated_weights": "is truncated"}


@pytest.mark.parametrize("kind", sorted(WORDS))
@pytest.mark.parametrize("command", ["train", "doctor", "eval", "merge"])
def test_a_bad_model_folder_is_named_by_every_command(tiny_model_dir, tmp_path, capsys, kind, command):
    folder = _bad_folder(kind, tiny_model_dir, tmp_path)
    argv = {"train": ["train", f"actor_rollout_ref.model.path={folder}", "trainer.device=cpu",
                      f"trainer.default_local_dir={tmp_path}/ckpt"],
            "doctor": ["doctor", "--parity", folder, "trainer.device=cpu"],
            "eval": ["eval", folder, "--task", "arith", "--limit", "1", "--engine", "hf"],
            "merge": ["merge", folder, "--adapter", str(tmp_path / "adapter"), "--out", str(tmp_path / "out")]}[command]
    capsys.readouterr()
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert WORDS[kind] in err and "Traceback" not in err, err
    assert not os.path.exists(tmp_path / "out")


def test_a_checkpoint_config_names_only_a_transformers_model_class():
    from types import SimpleNamespace

    from npu_rl.parallel.weights import hf_class_from_config

    assert hf_class_from_config(SimpleNamespace(architectures=["pipeline", "Qwen2ForCausalLM"])).__name__ == \
        "Qwen2ForCausalLM"
    for names in (["pipeline"], ["AutoModel"], ["__class__"], ["os.system"]):
        with pytest.raises(ValueError, match="expected a transformers model class name"):
            hf_class_from_config(SimpleNamespace(architectures=names))
