"""Helpers for end-to-end trainer runs on the tiny model (in-process, HF rollout unless a test asks for vLLM)."""

from __future__ import annotations

import glob
import json
import os
import textwrap

import pytest
import torch

from npu_rl.config.loader import load_config

# 8 training prompts -> 2 batches of 4 per epoch; 4 validation prompts.
TRAIN = "builtin://arith/train?num_train=8&num_test=4&seed=5"
VAL = "builtin://arith/test?num_train=8&num_test=4&seed=5"

# A reward a random character-level model can learn: the share of '7' in the response (partial credit, so the
# samples of a group differ from the start). `acc` is 1 when there is any '7'.
REWARD_FN = textwrap.dedent("""\
    import os
    import signal

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        crash_after = int(os.environ.get("NPU_RL_TEST_CRASH_AFTER", "0"))
        if crash_after:
            counter = os.environ["NPU_RL_TEST_COUNTER"]
            calls = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
            with open(counter, "w") as f:
                f.write(str(calls))
            if calls > crash_after:
                os.kill(os.getpid(), signal.SIGKILL)  # a kill -9 in the middle of a step (its reward phase)
        sevens = solution_str.count("7")
        return {"score": sevens / max(len(solution_str), 1), "acc": float(sevens > 0)}
    """)


def base_overrides(model_dir: str, out_dir: str, reward_file: str | None = None) -> list[str]:
    overrides = [
        f"data.train_files='{TRAIN}'", f"data.val_files='{VAL}'", "data.train_batch_size=4", "data.val_batch_size=4",
        "data.max_prompt_length=96", "data.max_response_length=8", "data.dataloader_num_workers=0", "data.seed=3",
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "trainer.n_gpus_per_node=1", "trainer.logger=[console]", "trainer.progress_bar=False",
        f"trainer.default_local_dir={out_dir}", "trainer.resume_mode=disable", "trainer.seed=7",
    ]
    if reward_file:
        overrides += [f"custom_reward_function.path={reward_file}", "custom_reward_function.name=compute_score"]
    return overrides


@pytest.fixture
def reward_file(tmp_path) -> str:
    path = tmp_path / "reward_sevens.py"
    path.write_text(REWARD_FN)
    return str(path)


def run_training(overrides: list[str]) -> int:
    from npu_rl.trainer.run import run

    return run(load_config(overrides, "ppo_trainer"))  # run() checks it first


def read_metrics(out_dir: str) -> list[dict]:
    """Rows of every run's metrics.jsonl under ``out_dir``, oldest run first."""
    rows = []
    for path in sorted(glob.glob(os.path.join(out_dir, "logs", "*", "metrics.jsonl"))):
        with open(path) as f:
            rows += [json.loads(line) for line in f]
    return rows


def step_rows(out_dir: str) -> dict[int, dict]:
    """Training-step rows by step (the row with actor metrics; validation-only rows are skipped)."""
    return {r["step"]: r for r in read_metrics(out_dir) if "actor/pg_loss" in r}


def final_weights(out_dir: str, step: int) -> dict[str, torch.Tensor]:
    from npu_rl.parallel.checkpoint import merge_checkpoint
    from transformers import AutoModelForCausalLM

    merged = merge_checkpoint(os.path.join(out_dir, f"global_step_{step}", "actor"), os.path.join(out_dir, "merged"))
    return AutoModelForCausalLM.from_pretrained(merged).state_dict()
