"""Vision-language GRPO end to end on CPU: a tiny random Qwen2.5-VL on the shipped visual task (builtin://shapes)
through `npu-rl train`; stopped after a checkpoint and resumed, it ends with the weights of a run never stopped;
the checkpoint merges into a loadable folder with its image processor; and a 2-process run (Ray, FSDP2, gloo)."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from npu_rl.models.synthetic import save_random_vl_model
from npu_rl.models.vision import load_vision_inputs, load_vl_model
from npu_rl.parallel.checkpoint import merge_checkpoint
from tests.conftest import REPO_ROOT
from tests.trainer.conftest import base_overrides, run_training, step_rows

DATA = "builtin://shapes/{}?num_train=16&num_test=4&size=56"


def _overrides(folder: str, out: str) -> list[str]:
    return base_overrides(folder, out) + [
        f"data.train_files='{DATA.format('train')}'", f"data.val_files='{DATA.format('test')}'",
        "data.max_prompt_length=128", "preset=grpo", "trainer.save_freq=1", "trainer.val_before_train=False",
        "trainer.test_freq=2"]


def _weights(out: str, step: int, tmp_path) -> dict[str, torch.Tensor]:
    merged = merge_checkpoint(os.path.join(out, f"global_step_{step}", "actor"), str(tmp_path / f"merged_{step}"))
    assert os.path.isfile(os.path.join(merged, "preprocessor_config.json"))
    assert load_vision_inputs(merged).spec.max_pixels == 56 * 56
    return load_vl_model(merged).state_dict()


def _train(*overrides: str) -> subprocess.CompletedProcess:
    """`npu-rl train` in a subprocess (one thread: the runs compared bit for bit must share it)."""
    proc = subprocess.run([sys.executable, "-m", "npu_rl.cli", "train", *overrides], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": REPO_ROOT, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_grpo_on_the_visual_task_checkpoint_resume_merge(tmp_path):
    folder = save_random_vl_model(str(tmp_path / "vl"))
    straight = str(tmp_path / "straight")
    _train(*_overrides(folder, straight), "trainer.total_training_steps=3")
    rows = step_rows(straight)
    assert sorted(rows) == [1, 2, 3]
    assert all(rows[s]["prompt_length/mean"] > 60 for s in rows)  # the image pads are in the prompts
    assert "val-core/shapes/acc/mean@1" in rows[2]  # validated on the test split at step 2 (test_freq)

    resumed = str(tmp_path / "resumed")
    common = _overrides(folder, resumed) + ["trainer.resume_mode=auto"]
    _train(*common, "trainer.total_training_steps=2")
    assert "resumed from" in _train(*common, "trainer.total_training_steps=3").stderr
    assert sorted(step_rows(resumed)) == [1, 2, 3]
    mine, theirs = _weights(resumed, 3, tmp_path), _weights(straight, 3, tmp_path / "s")
    assert mine.keys() == theirs.keys()
    moved = _weights(straight, 1, tmp_path / "one")
    assert any(not torch.equal(moved[k], theirs[k]) for k in theirs if k.startswith("model.visual."))
    for name in theirs:
        torch.testing.assert_close(mine[name], theirs[name], rtol=0, atol=0, msg=name)


def test_two_processes(tmp_path):
    folder = save_random_vl_model(str(tmp_path / "vl"))
    out = str(tmp_path / "run")
    assert run_training(_overrides(folder, out) + ["trainer.n_gpus_per_node=2", "trainer.total_training_steps=1"]) == 0
    rows = step_rows(out)
    assert sorted(rows) == [1] and rows[1]["perf/num_memory_reports"] == 2
    assert os.path.isfile(os.path.join(out, "global_step_1", "actor", "huggingface", "preprocessor_config.json"))


def test_lora_grpo_step_and_merge(tmp_path):
    """LoRA on the language model of a Qwen-VL actor: two GRPO steps with the hf rollout (the reference is the
    actor with its adapter off), the checkpoint's adapter merged by `npu-rl merge` into a loadable Qwen-VL folder
    whose language model moved and whose vision tower is the base's."""
    from npu_rl.commands.merge import merge_source

    folder = save_random_vl_model(str(tmp_path / "vl"))
    out = str(tmp_path / "run")
    assert run_training(_overrides(folder, out) + [
        "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.optim.lr=5e-2",
        "trainer.total_training_steps=2"]) == 0
    rows = step_rows(out)
    assert sorted(rows) == [1, 2] and all(torch.isfinite(torch.tensor(r["actor/pg_loss"])) for r in rows.values())
    actor_dir = os.path.join(out, "global_step_2", "actor")
    assert os.path.isdir(os.path.join(actor_dir, "lora_adapter"))
    merged = merge_source(actor_dir, str(tmp_path / "merged"))
    assert os.path.isfile(os.path.join(merged, "preprocessor_config.json"))
    mine, base = load_vl_model(merged).state_dict(), load_vl_model(folder).state_dict()
    assert mine.keys() == base.keys()
    assert any(not torch.equal(mine[k], base[k]) for k in base if k.startswith("model.language_model.layers."))
    assert all(torch.equal(mine[k], base[k]) for k in base if k.startswith("model.visual."))
