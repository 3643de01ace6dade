"""The Python API trains one step with ``model="modelscope://..."``: the tiny model sits in a pre-filled ModelScope
cache (MODELSCOPE_CACHE), the run is offline (HF_HUB_OFFLINE=1) with the endpoint pointing at a port nothing
listens on, so every consumer (actor, reference, rollout engine) must open the cached snapshot."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT
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
