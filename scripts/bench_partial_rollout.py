"""How long a fully-async weight push waits for the pool's in-flight call, with and without partial rollouts
(docs/async.md, "Partial rollouts").

    RAY_AUTH_MODE=disabled OMP_NUM_THREADS=1 python scripts/bench_partial_rollout.py [--steps 8] [--model PATH]

Runs the embedded default's task (1-digit arithmetic, GRPO) in the fully asynchronous trainer with a one-rank ``hf``
rollout pool, a push after every update and long responses (``--response-length`` tokens, ``ignore_eos``) so that a
push usually finds a call in flight; once with ``async_training.partial_rollout=false`` (the call finishes on the old
weights) and once with ``true`` (it stops at the next decode step and continues after the push). Prints the median
``async/push_wait_in_flight_s`` of each and the partial run's counts. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

from bench_async_overlap import run  # scripts/ is on sys.path when a script runs

COMMON = ["preset=grpo", "data.train_files=builtin://arith/train", "data.val_files=builtin://arith/test",
          "data.max_prompt_length=128", "data.dataloader_num_workers=0", "actor_rollout_ref.actor.optim.lr=2e-5",
          "actor_rollout_ref.model.enable_gradient_checkpointing=False", "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.n=4",
          "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.ignore_eos=True", "rollout.nnodes=1",
          "rollout.n_gpus_per_node=1", "rollout.total_rollout_steps=null", "data.train_batch_size=0",
          "async_training.staleness_threshold=3", "async_training.trigger_parameter_sync_step=1",
          "async_training.require_batches=1", "trainer.val_before_train=False", "trainer.test_freq=0",
          "trainer.save_freq=0", "trainer.progress_bar=False", "trainer.logger=[console,file]",
          "trainer.resume_mode=disable", "ray_kwargs.ray_init.num_cpus=2"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--response-length", type=int, default=48)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="actor_rollout_ref.model.path")
    args = parser.parse_args()
    common = COMMON + [f"trainer.total_training_steps={args.steps}", f"actor_rollout_ref.model.path={args.model}",
                       f"data.max_response_length={args.response_length}"]
    with tempfile.TemporaryDirectory() as tmp:
        runs = {partial: run(common + [f"async_training.partial_rollout={partial}"], os.path.join(tmp, partial),
                         "fully_async_ppo_trainer")
                for partial in ("False", "True")}
    wait = lambda rows: statistics.median(r["async/push_wait_in_flight_s"] for r in rows)  # noqa: E731
    last = runs["True"][-1]
    print(json.dumps({
        "steps": args.steps, "response_length": args.response_length,
        "push_wait_in_flight_s_median": {"partial_rollout=false": wait(runs["False"]),
                                         "partial_rollout=true": wait(runs["True"])},
        "step_s_median": {k: statistics.median(r["timing_s/step"] for r in rows[1:]) for k, rows in runs.items()},
        **{k: last[k] for k in ("async/partial/interrupted_pushes", "async/partial/resumed_samples",
                                "async/partial/kept_tokens")},
        "rows_spanning_a_push": sum(r.get("fully_async/partial/total_partial_num", 0) for r in runs["True"]),
    }, indent=1))


if __name__ == "__main__":
    main()
