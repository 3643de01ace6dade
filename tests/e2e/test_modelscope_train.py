"""A verl script run with VERL_USE_MODELSCOPE=True, its plain model id and data set ids unchanged, trains one step
through ``python -m npu_rl.trainer.main_ppo``: the model and the data set are served by a fake ModelScope server on
127.0.0.1 (MODELSCOPE_ENDPOINT), downloaded once into MODELSCOPE_CACHE, every consumer of the model (actor,
reference, rollout engine) opens that snapshot, and validation reads a split of the data set."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO_ROOT
from tests.fake_hub import folder_files
from tests.fake_modelscope import FakeModelScope
from tests.models.test_modelscope_hub import needs_modelscope
from tests.trainer.conftest import TRAIN, VAL, base_overrides, read_metrics, step_rows

REPO = "tiny-org/tiny-qwen"
SET = "tiny-org/arith-set"


def arith_files(tmp_path) -> dict[str, bytes]:
    """The built-in arithmetic set's two splits as a ModelScope data set repo lays them out."""
    env = dict(os.environ, NPU_RL_CACHE=str(tmp_path / "gen"), PYTHONPATH=REPO_ROOT)
    code = ("import sys; from npu_rl.data.builtin import resolve_builtin as r; print(r(sys.argv[1])); "
            "print(r(sys.argv[2]))")
    done = subprocess.run([sys.executable, "-c", code, TRAIN, VAL], env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    train, test = done.stdout.split()
    with open(train, "rb") as f, open(test, "rb") as g:
        return {"README.md": b"---\nlicense: mit\n---\n", "data/train-00000-of-00001.parquet": f.read(),
                "data/test-00000-of-00001.parquet": g.read()}


@needs_modelscope
def test_verl_switch_trains_a_model_and_data_served_by_modelscope(tiny_model_dir, tmp_path, reward_file):
    server = FakeModelScope().start()
    try:
        server.add(REPO, folder_files(tiny_model_dir))
        server.add_dataset(SET, arith_files(tmp_path))
        out = str(tmp_path / "run")
        overrides = [o for o in base_overrides(REPO, out, reward_file) if not o.startswith("data.") or
                     not o.split("=")[0].endswith("_files")] + [
            f"data.train_files={SET}/data/train-00000-of-00001.parquet", f"data.val_files={SET}?split=test",
            "algorithm.adv_estimator=grpo", "trainer.total_training_steps=1", "trainer.val_before_train=True",
            "trainer.test_freq=-1"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_OFFLINE", "MODELSCOPE_"))}
        env.update(VERL_USE_MODELSCOPE="True", MODELSCOPE_ENDPOINT=server.endpoint,
                   MODELSCOPE_CACHE=str(tmp_path / "ms"), MODELSCOPE_HOME=str(tmp_path / "ms-home"),
                   NPU_RL_CACHE=str(tmp_path / "npu_rl"), HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="0",
                   OMP_NUM_THREADS="1", PYTHONPATH=REPO_ROOT)
        done = subprocess.run([sys.executable, "-m", "npu_rl.trainer.main_ppo", *overrides], cwd=str(tmp_path),
                              env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        assert sorted(step_rows(out)) == [1]
        weights = [r for r in server.requests if "FilePath=model.safetensors" in r]
        assert len(weights) == 1  # downloaded once, then read from the cache by every consumer
        snapshot = tmp_path / "ms" / "models" / "tiny-org--tiny-qwen" / "snapshots" / "master"
        assert (snapshot / "model.safetensors").is_file()
        data = tmp_path / "ms" / "datasets" / "tiny-org--arith-set" / "snapshots" / "master" / "data"
        assert sorted(os.listdir(data)) == ["test-00000-of-00001.parquet", "train-00000-of-00001.parquet"]
        for name in sorted(os.listdir(data)):  # each data file downloaded once
            assert len([r for r in server.requests if f"FilePath=data%2F{name}" in r]) == 1, name
        assert any(k.startswith("val-core/") for r in read_metrics(out) for k in r)  # the split validated on
        assert not (tmp_path / "hf" / "hub").exists() or not os.listdir(tmp_path / "hf" / "hub")  # not from HF
    finally:
        server.stop()
