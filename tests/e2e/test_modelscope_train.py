"""A verl script run with VERL_USE_MODELSCOPE=True, its plain model id unchanged, trains one step through
``python -m npu_rl.trainer.main_ppo``: the model is served by a fake ModelScope server on 127.0.0.1
(MODELSCOPE_ENDPOINT), downloaded once into MODELSCOPE_CACHE, and every consumer (actor, reference, rollout engine)
opens that snapshot."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO_ROOT
from tests.fake_hub import folder_files
from tests.fake_modelscope import FakeModelScope
from tests.models.test_modelscope_hub import needs_modelscope
from tests.trainer.conftest import base_overrides, step_rows

REPO = "tiny-org/tiny-qwen"


@needs_modelscope
def test_verl_switch_trains_a_model_served_by_modelscope(tiny_model_dir, tmp_path, reward_file):
    server = FakeModelScope().start()
    try:
        server.add(REPO, folder_files(tiny_model_dir))
        out = str(tmp_path / "run")
        overrides = base_overrides(REPO, out, reward_file) + [
            "algorithm.adv_estimator=grpo", "trainer.total_training_steps=1", "trainer.val_before_train=False",
            "trainer.test_freq=-1"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_OFFLINE", "MODELSCOPE_"))}
        env.update(VERL_USE_MODELSCOPE="True", MODELSCOPE_ENDPOINT=server.endpoint,
                   MODELSCOPE_CACHE=str(tmp_path / "ms"), MODELSCOPE_HOME=str(tmp_path / "ms-home"),
                   HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="0", OMP_NUM_THREADS="1", PYTHONPATH=REPO_ROOT)
        done = subprocess.run([sys.executable, "-m", "npu_rl.trainer.main_ppo", *overrides], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        assert sorted(step_rows(out)) == [1]
        weights = [r for r in server.requests if "FilePath=model.safetensors" in r]
        assert len(weights) == 1  # downloaded once, then read from the cache by every consumer
        snapshot = tmp_path / "ms" / "models" / "tiny-org--tiny-qwen" / "snapshots" / "master"
        assert (snapshot / "model.safetensors").is_file()
        assert not (tmp_path / "hf" / "hub").exists() or not os.listdir(tmp_path / "hf" / "hub")  # not from HF
    finally:
        server.stop()
