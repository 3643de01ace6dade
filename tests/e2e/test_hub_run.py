"""A verl script that names a Hub model and a parquet on disk runs after changing only the module name: the model is
served by a fake Hub on 127.0.0.1 (HF_ENDPOINT), downloaded once into HF_HOME's cache, and every consumer (actor,
reference, rollout engine) opens that snapshot."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from npu_rl.data.builtin import resolve_builtin
from tests.conftest import REPO_ROOT
from tests.fake_hub import FakeHub, folder_files
from tests.trainer.conftest import TRAIN, VAL, base_overrides, step_rows

REPO = "tiny-org/tiny-qwen"


def test_verl_overrides_with_a_hub_model_and_a_parquet_train(tiny_model_dir, tmp_path, reward_file):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(resolve_builtin(TRAIN), data / "train.parquet")
    shutil.copy(resolve_builtin(VAL), data / "test.parquet")
    hub = FakeHub().start()
    try:
        hub.add("models", REPO, folder_files(tiny_model_dir))
        out = str(tmp_path / "run")
        overrides = [o for o in base_overrides(REPO, out, reward_file) if not o.startswith("data.")]
        overrides += [f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
                      "data.train_batch_size=4", "data.val_batch_size=4", "data.max_prompt_length=96",
                      "data.max_response_length=8", "data.dataloader_num_workers=0",
                      "algorithm.adv_estimator=grpo", "trainer.total_training_steps=1",
                      "trainer.val_before_train=False", "trainer.test_freq=-1"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_OFFLINE"))}
        env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=hub.endpoint, HF_HUB_OFFLINE="0", OMP_NUM_THREADS="1",
                   PYTHONPATH=REPO_ROOT)
        done = subprocess.run([sys.executable, "-m", "npu_rl.trainer.main_ppo", *overrides], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        assert sorted(step_rows(out)) == [1]
        weights = [r for r in hub.requests if r.startswith("GET") and r.endswith("/model.safetensors")]
        assert len(weights) == 1  # downloaded once, then read from the cache by every consumer
        snapshot = tmp_path / "hf" / "hub" / "models--tiny-org--tiny-qwen" / "snapshots" / hub.sha("models", REPO)
        assert (snapshot / "model.safetensors").is_file()
    finally:
        hub.stop()
