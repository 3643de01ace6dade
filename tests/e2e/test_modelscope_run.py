"""The Python API trains one step with ``model="modelscope://..."``: the tiny model sits in a pre-filled ModelScope
cache (MODELSCOPE_CACHE), the run is offline (HF_HUB_OFFLINE=1) with the endpoint pointing at a port nothing
listens on, so every consumer (actor, reference, rollout engine) must open the cached snapshot. And one step on a
ModelScope data set's files and split, from that cache the same way."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO_ROOT
from tests.e2e.test_modelscope_train import arith_files
from tests.e2e.test_trainer_api import SCRIPT, SMALL
from tests.fake_hub import folder_files
from tests.models.test_modelscope_hub import needs_modelscope, prefill

REPO = "tiny-org/tiny-qwen"


@needs_modelscope
@pytest.mark.parametrize("path", [f"modelscope://{REPO}", REPO])  # REPO: under VERL_USE_MODELSCOPE=True
def test_the_python_api_trains_a_modelscope_model_from_the_cache(tiny_model_dir, tmp_path, path):
    cache = str(tmp_path / "ms")
    snapshot = prefill(cache, REPO, folder_files(tiny_model_dir))
    script = tmp_path / "train_rl.py"
    script.write_text(SCRIPT)
    config = copy.deepcopy(SMALL)
    config["trainer"].update(total_training_steps=1, save_freq=-1)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MODELSCOPE_", "VERL_USE_MODELSCOPE"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=REPO_ROOT, MODELSCOPE_CACHE=cache, HF_HOME=str(tmp_path / "hf"),
               MODELSCOPE_HOME=str(tmp_path / "ms-home"), MODELSCOPE_ENDPOINT="http://127.0.0.1:9",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if "://" not in path:
        env["VERL_USE_MODELSCOPE"] = "True"
    out = subprocess.run([sys.executable, str(script), path, json.dumps(config), str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=600, cwd=str(tmp_path), env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["step"] == 1
    with open(os.path.join(result["run_dir"], "config.yaml")) as f:
        assert f"path: {path}" in f.read()  # the run recorded the id it was given
    assert os.listdir(snapshot)  # the cache is left as it was: nothing downloaded, nothing removed


DATA_SCRIPT = textwrap.dedent("""\
    import json, sys
    from npu_rl import Trainer
    def sevens(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        return solution_str.count("7") / max(len(solution_str), 1)
    if __name__ == "__main__":
        result = Trainer(model=sys.argv[1], reward_funcs=[sevens], train_dataset=sys.argv[4], eval_dataset=sys.argv[5],
                         config=json.loads(sys.argv[2]), output_dir=sys.argv[3]).train()
        print(json.dumps({"step": result.global_step, "metrics": result.metrics}))
    """)


@needs_modelscope
def test_the_python_api_trains_on_a_modelscope_data_set_from_the_cache(tiny_model_dir, tmp_path):
    """Offline, the data set's files in a pre-filled MODELSCOPE_CACHE: a glob of its files to train on, a split of
    it (through datasets) to validate on; an entry not cached stops the run before training, naming the cache."""
    cache = str(tmp_path / "ms")
    snapshot = os.path.join(cache, "datasets", "tiny-org--arith-set", "snapshots", "master")
    for name, data in arith_files(tmp_path).items():
        os.makedirs(os.path.dirname(os.path.join(snapshot, name)), exist_ok=True)
        with open(os.path.join(snapshot, name), "wb") as f:
            f.write(data)
    script = tmp_path / "train_rl.py"
    script.write_text(DATA_SCRIPT)
    config = copy.deepcopy(SMALL)
    config["trainer"].update(total_training_steps=1, save_freq=-1, val_before_train=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MODELSCOPE_", "VERL_USE_MODELSCOPE"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=REPO_ROOT, MODELSCOPE_CACHE=cache, HF_HOME=str(tmp_path / "hf"),
               MODELSCOPE_HOME=str(tmp_path / "ms-home"), MODELSCOPE_ENDPOINT="http://127.0.0.1:9",
               NPU_RL_CACHE=str(tmp_path / "npu_rl"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    args = [sys.executable, str(script), tiny_model_dir, json.dumps(config), str(tmp_path / "out"),
            "modelscope://tiny-org/arith-set/data/train-*.parquet", "modelscope://tiny-org/arith-set?split=test"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=str(tmp_path), env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["step"] == 1 and any(k.startswith("val-core/") for k in result["metrics"])
    args[-2] = "modelscope://tiny-org/not-cached/train.parquet"
    out = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=str(tmp_path), env=env)
    assert out.returncode != 0
    assert "'modelscope://tiny-org/not-cached/train.parquet': no file train.parquet in the ModelScope cache" in \
        out.stderr and cache in out.stderr, out.stderr[-3000:]
