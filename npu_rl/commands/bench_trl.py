"""``npu-rl bench trl``: TRL's ``GRPOTrainer`` and ``npu-rl train`` on the same model, task, sizes and device, in one
invocation; prints both wall times, step times and their ratio.

    npu-rl bench trl                                   # the embedded default: SmolLM2-135M, arith, 4 x 8, 24 tokens
    npu-rl bench trl --model shape:qwen2.5-0.5b --prompts 16 --n 4 --prompt-length 128 --response-length 256 \\
        --steps 5 --ignore-eos                         # a real architecture's shape, random weights

Each side runs in its own interpreter (``--side trl`` / ``--side ours``), so neither inherits the other's compiled
kernels or allocator state; wall time counts from the interpreter's start to the last step (imports, model load,
every step), step times come from each trainer's own clock. Both sides: GRPO, one update per batch (TRL's
``num_iterations=1``; ours one mini-batch, one epoch), no KL term and no reference model (TRL's default ``beta=0``;
ours ``use_kl_loss=False``), the same learning rate, temperature 1, no validation, no checkpoints. TRL generates with
Hugging Face ``generate``; ours with ``--engine`` (``vllm`` where installed, else hf). TRL is an optional benchmark
dependency (``pip install trl``; carried to the H200 by scripts/gpu/carry_vllm.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from npu_rl.data.builtin import resolve_builtin
from npu_rl.data.io import read_rows, write_parquet
from npu_rl.device import get_backend
from npu_rl.models.loader import resolve_model_path
from npu_rl.models.synthetic import save_random_model
from npu_rl.reward.scorers import arith_score
from npu_rl.trainer.main_ppo import main as train_main

START = time.perf_counter()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="npu-rl bench trl", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="model.path, or shape:NAME (random weights)")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--prompt-length", type=int, default=128, help="shape: models: prompt tokens (random ids)")
    p.add_argument("--response-length", type=int, default=24)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--ignore-eos", action="store_true", help="every response runs to --response-length")
    p.add_argument("--engine", default="vllm", choices=("vllm", "hf"), help="our rollout engine")
    p.add_argument("--sides", default="trl,ours")
    p.add_argument("--side", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="write both sides' results as JSON here")
    p.add_argument("overrides", nargs="*", help="extra config overrides for our side")
    return p


def _prompt_rows(args, tmp: str):
    """(model folder, rows): rows are dicts with ``prompt`` (chat messages or token ids) and ``answer``."""
    if args.model.startswith("shape:"):
        import torch


        folder = save_random_model(os.path.join(tmp, "model"), args.model[6:], dtype=torch.bfloat16)
        generator = torch.Generator().manual_seed(0)
        rows = [{"prompt": "".join(chr(97 + int(c)) for c in torch.randint(0, 26, (args.prompt_length,),
                                                                          generator=generator)), "answer": "0"}
                for _ in range(args.prompts * args.steps)]
        return folder, rows

    rows = [{"prompt": list(r["prompt"]), "answer": str(r["reward_model"]["ground_truth"])}
            for r in read_rows(resolve_builtin("builtin://arith/train"))]
    return resolve_model_path(args.model), rows[: args.prompts * args.steps]


def run_trl(args) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer


    tmp = tempfile.mkdtemp(prefix="npu-rl-bench-trl-")
    folder, rows = _prompt_rows(args, tmp)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)

    def reward(prompts, completions, answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(arith_score(t, a)["score"]) for t, a in zip(texts, answer)]

    step_ends: list[float] = []


    class Clock(TrainerCallback):
        def on_step_end(self, *_, **__):
            step_ends.append(time.perf_counter())

    config = GRPOConfig(
        output_dir=os.path.join(tmp, "out"), per_device_train_batch_size=args.prompts * args.n,
        num_generations=args.n, max_completion_length=args.response_length, max_steps=args.steps,
        learning_rate=args.lr, temperature=1.0, beta=0.0, num_iterations=1, gradient_accumulation_steps=1,
        bf16=get_backend().is_accelerator, logging_steps=1, report_to="none", save_strategy="no", seed=0,
        dataloader_num_workers=0, lr_scheduler_type="constant", warmup_steps=0)
    if args.ignore_eos:
        config.generation_kwargs = {"min_new_tokens": args.response_length}
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, callbacks=[Clock()])
    train_start = time.perf_counter()
    trainer.train()
    return _summary("trl", train_start, step_ends)


def _summary(side: str, train_start: float, step_ends: list[float]) -> dict:
    steps = [b - a for a, b in zip([train_start] + step_ends[:-1], step_ends)]
    steady = sorted(steps[1:])[len(steps[1:]) // 2] if len(steps) > 1 else float("nan")
    return {"side": side, "wall_s": step_ends[-1] - START if step_ends else float("nan"),
            "steps_s": sum(steps), "first_step_s": steps[0] if steps else float("nan"), "steady_step_s": steady,
            "num_steps": len(steps)}


def run_ours(args) -> dict:
    tmp = tempfile.mkdtemp(prefix="npu-rl-bench-ours-")
    overrides = [f"data.train_batch_size={args.prompts}", f"actor_rollout_ref.rollout.n={args.n}",
                 f"data.max_response_length={args.response_length}", f"trainer.total_training_steps={args.steps}",
                 f"actor_rollout_ref.actor.optim.lr={args.lr}", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
                 "actor_rollout_ref.actor.ppo_epochs=1", "actor_rollout_ref.actor.use_kl_loss=False",
                 "algorithm.use_kl_in_reward=False", "actor_rollout_ref.rollout.temperature=1.0",
                 f"actor_rollout_ref.rollout.name={args.engine}", "trainer.val_before_train=False",
                 "trainer.test_freq=-1", f"trainer.save_freq={args.steps + 1}", "trainer.resume_mode=disable",
                 "trainer.logger=[file]", f"trainer.default_local_dir={tmp}/run"]
    if args.model.startswith("shape:"):
        folder, rows = _prompt_rows(args, tmp)
        verl_rows = [{"data_source": "arith", "prompt": [{"role": "user", "content": r["prompt"]}],
                      "reward_model": {"ground_truth": r["answer"]}, "extra_info": {"index": i}}
                     for i, r in enumerate(rows)]
        data = write_parquet(verl_rows, os.path.join(tmp, "train.parquet"))
        overrides += [f"actor_rollout_ref.model.path={folder}", f"data.train_files={data}", f"data.val_files={data}",
                      f"data.max_prompt_length={args.prompt_length + 32}"]
    if args.ignore_eos:
        overrides.append("actor_rollout_ref.rollout.ignore_eos=True")

    train_start = time.perf_counter()
    code = train_main(overrides + list(args.overrides), default_config="quickstart")
    if code:
        raise RuntimeError(f"npu-rl train exited with {code}")
    metrics_file = next(os.path.join(d, "metrics.jsonl") for d, _, files in os.walk(tmp) if "metrics.jsonl" in files)
    steps = [json.loads(line) for line in open(metrics_file)]
    steps = [m["timing_s/step"] for m in steps if "timing_s/step" in m]
    ends, t = [], train_start
    for s in steps:
        t += s
        ends.append(t)
    out = _summary("ours", train_start, ends)
    out["wall_s"] = time.perf_counter() - START  # to the end of the run (curves and the record included)
    return out


def side_argv(argv: list[str]) -> list[str]:
    """The arguments each side's interpreter gets: all but ``--out`` and its value (the parent writes the file)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--out":
            skip = True
        elif not arg.startswith("--out="):
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.side:
        result = run_trl(args) if args.side == "trl" else run_ours(args)
        print("BENCH_TRL_RESULT " + json.dumps(result), flush=True)
        return 0
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if "trl" in sides:
        import importlib.util

        if importlib.util.find_spec("trl") is None:
            print("npu-rl bench trl: TRL is not installed (pip install trl)", file=sys.stderr)
            return 2
    forwarded = side_argv(list(argv if argv is not None else sys.argv[1:]))
    results = {}
    for side in sides:
        proc = subprocess.run([sys.executable, "-m", "npu_rl.commands.bench_trl", "--side", side, *forwarded],
                              stdout=subprocess.PIPE, text=True)
        sys.stdout.write(proc.stdout[-3000:])
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_TRL_RESULT ")), None)
        if proc.returncode or line is None:
            print(f"npu-rl bench trl: the {side} side failed (exit {proc.returncode})", file=sys.stderr)
            return 1
        results[side] = json.loads(line.split(" ", 1)[1])
    print(render(results, args))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"args": vars(args), "results": results}, fh, indent=2)
    return 0


def render(results: dict, args) -> str:
    lines = [f"{args.model}: {args.prompts} prompts x {args.n} x {args.response_length} new tokens, {args.steps} steps",
             "| side | wall s | steps s | first step s | steady step s |", "|---|---|---|---|---|"]
    for side, r in results.items():
        lines.append(f"| {side} | {r['wall_s']:.1f} | {r['steps_s']:.1f} | {r['first_step_s']:.2f} | "
                     f"{r['steady_step_s']:.2f} |")
    if {"trl", "ours"} <= set(results):
        t, o = results["trl"], results["ours"]
        lines.append(f"ours / trl: wall {o['wall_s'] / t['wall_s']:.2f}x, steady step "
                     f"{o['steady_step_s'] / t['steady_step_s']:.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
