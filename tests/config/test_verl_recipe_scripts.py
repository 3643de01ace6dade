"""verl-recipe's FAPO and ReTool 32B run scripts, copied as they are (tests/config/data/verl_recipe/, with the recipe
files they name and the recipe repository's licence), each with only its module changed (``verl.trainer.main_ppo``
-> ``npu_rl.trainer.main_ppo``), read as ``npu-rl migrate`` reads a script and checked with ``--cfg job`` (the config
loaded and validated, nothing trained). The model and data paths come from the variables the scripts read
(``MODEL_PATH``, ``TRAIN_FILE``, ``HDFS_ROOT`` ...), the recipe files from ``recipe/`` in the working folder, as in a
verl checkout. Where a script does not load, it stops on refusals that name the key and the reason, never an unknown
key; docs/coming_from_verl.md lists them.

The recipe's reward functions import verl (``verl.utils.reward_score.math_dapo`` ...). Without verl the scripts stop
there, naming the import; with verl importable (checked with verl 0.6.1 installed beside npu-rl, ``pip install
--no-deps verl==0.6.1 tensordict pyvers``) the FAPO baseline and the FAPO-remote 32B scripts load as they are."""

from __future__ import annotations

import importlib.util
import os

import pytest

from npu_rl.compat.verl.migrate import split_flags
from npu_rl.compat.verl.script import check_text, read_script
from npu_rl.trainer.main_ppo import main
from tests.conftest import REPO_ROOT
from tests.helpers import write_verl_parquet

RECIPE = os.path.join(REPO_ROOT, "tests", "config", "data", "verl_recipe")
HAVE_VERL = importlib.util.find_spec("verl") is not None
VERL_MISSING = "imports verl, which is not installed"
SGLANG = "reward_model.rollout.name=sglang: a generative reward model runs on the hf or the vllm engine here"
ROUTER = "takes reward_router_address: it calls verl's generative reward model HTTP router"
CUSTOM_CLS = "verl's dataset classes subclass verl's RLHFDataset"
# script -> the problems (prefixes or fragments) it stops on; [] : it loads. Without verl, then with verl importable.
WITHOUT_VERL = {
    "fapo/run_baseline_32b.sh": ["custom_reward_function.path: cannot import {work}/recipe/fapo/reward_fn_reasoning.py",
                                 VERL_MISSING],
    "fapo/run_fapo_32b_remote.sh": [
        "custom_reward_function.path: cannot import {work}/recipe/fapo/reward_fn_reasoning_remote.py", VERL_MISSING],
    "fapo/run_fapo_32b.sh": [VERL_MISSING, SGLANG],
    "retool/run_qwen2-32b_dapo.sh": ["data.custom_cls.path=recipe/retool/retool.py: " + CUSTOM_CLS,
                                     "data.custom_cls.name=CustomRLHFDataset: " + CUSTOM_CLS],
    "retool/run_qwen2-32b_ppo.sh": ["data.custom_cls.path=recipe/retool/retool.py: " + CUSTOM_CLS,
                                    "data.custom_cls.name=CustomRLHFDataset: " + CUSTOM_CLS],
}
WITH_VERL = {**WITHOUT_VERL, "fapo/run_baseline_32b.sh": [], "fapo/run_fapo_32b_remote.sh": [],
             "fapo/run_fapo_32b.sh": [SGLANG, ROUTER]}


@pytest.fixture(scope="module")
def work(tmp_path_factory, tiny_model_dir):
    """A working folder as a verl checkout has it: recipe/ beside the data and the model the variables name."""
    folder = tmp_path_factory.mktemp("verl_checkout")
    os.symlink(RECIPE, folder / "recipe")
    for name in ("train.parquet", "test.parquet"):
        write_verl_parquet(folder / name)
    return str(folder)


def _read(name: str, work: str, tiny_model_dir: str) -> list[str]:
    with open(os.path.join(RECIPE, name), "rb") as f:
        original = f.read()
    assert original.count(b"verl.trainer.main_ppo") == 1
    text = original.replace(b"verl.trainer.main_ppo", b"npu_rl.trainer.main_ppo")  # the only change
    env = {"HOME": work, "MODEL_PATH": tiny_model_dir, "GRM_PATH": tiny_model_dir,
           "TRAIN_FILE": f"{work}/train.parquet", "TEST_FILE": f"{work}/test.parquet", "HDFS_ROOT": work,
           "DATA_ROOT": work}
    reading = read_script(check_text(text, name), env)
    assert reading.entry_point == "npu_rl.trainer.main_ppo"
    overrides, flags, _ = split_flags(reading.overrides)
    assert flags.config_name == "ppo_trainer" and flags.config_path is None
    return overrides


@pytest.mark.parametrize("name", sorted(WITHOUT_VERL))
def test_the_32b_scripts_load_or_stop_on_named_refusals(name, work, tiny_model_dir, monkeypatch, capsys):
    overrides = _read(name, work, tiny_model_dir)
    monkeypatch.chdir(work)  # the scripts name recipe/... relative to the checkout
    code = main(["--cfg", "job", *overrides])
    err = capsys.readouterr().err
    expected = [e.format(work=work) for e in (WITH_VERL if HAVE_VERL else WITHOUT_VERL)[name]]
    if not expected:
        assert code == 0 and "# config 'ppo_trainer' is valid" in err, err
        return
    assert code == 2, err
    problems = [line[4:] for line in err.splitlines() if line.startswith("  - ")]
    assert "unknown config key" not in err
    for fragment in expected:
        assert any(fragment in p for p in problems), (fragment, problems)
    # nothing else: every problem is one of those named (the FAPO router's function also fails the signature check,
    # which names the same parameter)
    assert all(any(f in p for f in expected) or "reward_router_address" in p for p in problems), problems


def test_the_copies_are_the_recipes_files():
    with open(os.path.join(RECIPE, "README.md"), encoding="utf-8") as f:
        notice = f.read()
    assert "verl-project/verl-recipe@48ea0a797fa29867ea0ad92aff7d284eec7d4be3" in notice
    names = sorted(os.path.relpath(os.path.join(root, n), RECIPE) for root, _, files in os.walk(RECIPE) for n in files)
    assert names == ["LICENSE", "README.md", "fapo/reward_fn_reasoning.py", "fapo/reward_fn_reasoning_remote.py",
                     "fapo/run_baseline_32b.sh", "fapo/run_fapo_32b.sh", "fapo/run_fapo_32b_remote.sh",
                     "retool/retool.py", "retool/retool_dataset_utils.py", "retool/run_qwen2-32b_dapo.sh",
                     "retool/run_qwen2-32b_ppo.sh", "retool/sandbox_fusion_tool_config.yaml"]
    with open(os.path.join(RECIPE, "LICENSE"), encoding="utf-8") as f:
        assert "Apache License" in f.read(200)
