"""The overlap of one-step off-policy against the synchronous trainer, same model, task and sizes (docs/async.md).

    RAY_AUTH_MODE=disabled OMP_NUM_THREADS=1 python scripts/bench_async_overlap.py [--steps 5] [--model PATH]

Runs the embedded default's task (1-digit arithmetic, GRPO) for ``--steps`` steps twice: sync
(``npu_rl.trainer.main_ppo``) and one-step off-policy with a one-rank rollout pool (``hf`` engine, its own copy of the
model). Prints the median step time of each (steps 2.. : the first one-step-off step cannot overlap) and the
one-step-off run's ``async/overlap_ratio`` (the share of generation the trainer did not wait for). A measurement,
not a test: on a shared CPU both pools compete for the same cores.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import tempfile

COMMON = ["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=8",
          "actor_rollout_ref.rollout.name=hf", "trainer.val_before_train=False", "trainer.test_freq=0",
          "trainer.save_freq=0", "trainer.progress_bar=False", "trainer.logger=[console,file]",
          "trainer.resume_mode=disable", "ray_kwargs.ray_init.num_cpus=2"]
ASYNC = ["actor_rollout_ref.hybrid_engine=False", "rollout.nnodes=1", "rollout.n_gpus_per_node=1",
         "algorithm.rollout_correction.bypass_mode=True", "actor_rollout_ref.rollout.calculate_log_probs=True",
         "actor_rollout_ref.rollout.free_cache_engine=False", "async_training.mode=one_step_off"]


def run(overrides: list[str], out: str, config_name: str = "quickstart") -> list[dict]:
    """Train with ``overrides`` into ``out``; the step rows of its metrics, in step order (also used by
    scripts/bench_partial_rollout.py)."""
    from npu_rl.config.loader import load_config
    from npu_rl.trainer.run import run as train

    assert train(load_config(overrides + [f"trainer.default_local_dir={out}"], config_name)) == 0
    rows = []
    for path in glob.glob(os.path.join(out, "logs", "*", "metrics.jsonl")):
        with open(path) as f:
            rows += [json.loads(line) for line in f]
    return sorted((r for r in rows if "timing_s/step" in r), key=lambda r: r["step"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--model", default=None, help="actor_rollout_ref.model.path (default: the embedded model)")
    args = parser.parse_args()
    common = COMMON + [f"trainer.total_training_steps={args.steps}"]
    if args.model:
        common.append(f"actor_rollout_ref.model.path={args.model}")
    with tempfile.TemporaryDirectory() as tmp:
        sync = run(common, os.path.join(tmp, "sync"))
        off = run(common + ASYNC, os.path.join(tmp, "off"))
    steady = lambda rows, key: statistics.median(r[key] for r in rows[1:])  # noqa: E731
    print(json.dumps({
        "steps": args.steps,
        "sync_step_s": steady(sync, "timing_s/step"), "sync_gen_s": steady(sync, "timing_s/gen"),
        "one_step_off_step_s": steady(off, "timing_s/step"),
        "one_step_off_trainer_wait_s": steady(off, "async/trainer_wait_s"),
        "one_step_off_overlap_ratio": steady(off, "async/overlap_ratio"),
        "one_step_off_staleness_max": max(r["async/staleness/max"] for r in off),
    }, indent=1))


if __name__ == "__main__":
    main()
