"""``npu-rl bench verl``: verl's ``main_ppo`` and ``npu-rl train`` run the same GRPO job in one invocation, on the same
device, and the report puts their step time, tokens/s/GPU, phases, peak memory and held-out score side by side.

    npu-rl bench verl --model shape:qwen2.5-0.5b --prompts 16 --n 4 --prompt-length 128 --response-length 256 \\
        --steps 5 --ignore-eos                                  # a real architecture's shape, random weights
    npu-rl bench verl                                           # the embedded task: SmolLM2-135M on arithmetic
    npu-rl bench verl --repeat 2 --out bench.json               # a cold run, then a warm one, of each side

One job, one list of verl's own keys: both sides get the same overrides (npu-rl reads verl's keys), so the model
folder, the data, the batch and micro-batch sizes, the lengths, ``n``, the learning rate, the precision recipe (each
side's default: fp32 master weights, bf16 compute), FSDP2 for the actor and vLLM for the rollouts with sleep / wake
(``free_cache_engine``), the reward function (one Python file, verl's ``compute_score`` signature) and
``gpu_memory_utilization`` are the same. Neither side saves a checkpoint (``trainer.save_freq=-1``). With held-out
rows (the embedded task's test split, or ``--val-files``) each side validates before the first step and after the
last with greedy decoding (``val_kwargs``).

Each side runs in its own interpreter, one after the other; wall time is the side's process from start to exit
(imports, Ray, the engine build, compilation, every step, shut-down). Each side has its own compile caches
(vLLM's, Inductor's, Triton's) in the bench's folder, empty for the first run: with ``--repeat 2`` the first run is
cold and the second warm, and the report shows them apart. Steady step: the median step after the first.

``--sides verl,ours,trl`` adds TRL's ``GRPOTrainer`` as a third side on the same job (npu_rl/commands/bench_trl_side.py:
the same model folder, rows, sizes, learning rate and micro-batches, fp32 master weights with bf16 compute, vLLM in
its colocate mode with sleep mode and the same memory share, no KL term, one update per batch, no checkpoint; TRL
skips the old-log-prob pass on-policy and logs no phases). verl 0.9.1's model patch fails where TRL 1.16 can be
imported, so on a machine with verl, TRL is installed apart (``pip install --target DIR trl==1.16.0``) and named by
``--trl-site DIR``: only the TRL side's interpreter sees it.

The bench folder (``--dir``) keeps every finished run in ``results.jsonl``: a later invocation of the same job (the
same keys) on the same folder reports the earlier runs beside its own, and its runs count on from them (warm). So the
two sides of a row too long for one device call can run one call each (``--sides verl``, then ``--sides ours``).

verl is an optional benchmark dependency (``pip install verl`` and its runtime: scripts/gpu/verl_wheels.txt, carried
to the H200 by ``WITH_VERL=1 scripts/gpu/carry_vllm.sh``).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from npu_rl.commands.bench_trl import CACHE_VARIABLES
from npu_rl.data.builtin import resolve_builtin
from npu_rl.data.io import read_rows, write_parquet
from npu_rl.models.loader import resolve_model_path
from npu_rl.models.synthetic import save_random_model

SIDES = ("verl", "ours", "trl")
# the phases in the report: (label, verl's metric, ours); both write verl's timing_s/<phase> names except the sync
PHASES = (("gen", "timing_s/gen", "timing_s/gen"),
          ("reward", "timing_s/reward", "timing_s/reward"),
          ("old_log_prob", "timing_s/old_log_prob", "timing_s/old_log_prob"),
          ("ref", "timing_s/ref", "timing_s/ref"),
          ("update_actor", "timing_s/update_actor", "timing_s/update_actor"),
          ("weight_sync", "timing_s/update_weights", "timing_s/rollout_update_weights"))

# Peak memory, the peak of torch's allocator in each side's training process, which is not the same memory: ours
# runs the rollout engine in that process (vLLM's pool is counted there), verl's actor worker does not (its vLLM
# server is another process, and verl logs the actor's peak as actor/perf/...), TRL's colocated vLLM sleeps outside it
PEAK_KEY = {"ours": "perf/max_memory_allocated_gb", "verl": "actor/perf/max_memory_allocated_gb",
            "trl": "perf/max_memory_allocated_gb"}
PEAK_SCOPE = {"ours": "trainer process, the rollout engine's memory included",
              "verl": "actor worker, vLLM's server process apart", "trl": "trainer process, torch's allocator only"}

REWARD_FILE = '''"""The bench's reward, verl's compute_score signature: the same file on both sides."""
from npu_rl.reward.scorers import arith_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source == "bench_random":  # random-weight shapes: any score; the step's cost is what is measured
        return float(len(solution_str) % 2)
    return float(arith_score(solution_str, ground_truth)["score"])
'''


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="npu-rl bench verl", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="model.path, or shape:NAME (random weights)")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step (data.train_batch_size)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt (actor_rollout_ref.rollout.n)")
    p.add_argument("--prompt-length", type=int, default=128, help="shape: models: prompt tokens (random text)")
    p.add_argument("--response-length", type=int, default=64, help="data.max_response_length")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--micro-batch", type=int, default=8, help="ppo_micro_batch_size_per_gpu and the log-prob "
                   "passes' log_prob_micro_batch_size_per_gpu, both sides")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--ignore-eos", action="store_true", help="every response runs to --response-length")
    p.add_argument("--padding", default="auto", choices=("auto", "packed", "padded"),
                   help="both sides: packed (use_remove_padding, verl's flash-attn 2 path) or padded (SDPA); auto: "
                        "packed where the flash_attn package is installed, else padded (verl needs it to pack)")
    p.add_argument("--val-rows", type=int, default=200, help="held-out rows of the embedded task (0: none)")
    p.add_argument("--sides", default="verl,ours",
                   help="any of verl, ours, trl (TRL's GRPOTrainer with its vLLM colocate mode, the same job)")
    p.add_argument("--trl-engine", default="vllm", choices=("vllm", "hf"),
                   help="TRL's rollout: vllm (its colocate mode, as the other sides use vLLM) or hf (generate)")
    p.add_argument("--trl-site", default=None,
                   help="a folder with TRL installed apart (pip install --target), put on the TRL side's path only: "
                        "verl 0.9.1's model patch fails where TRL 1.16 is importable")
    p.add_argument("--repeat", type=int, default=1, help="runs of each side; the first is cold (empty caches)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds a side may run")
    p.add_argument("--dir", default=None, help="the bench's folder (default: a new temporary one)")
    p.add_argument("--out", default=None, help="write every run's figures as JSON here")
    p.add_argument("overrides", nargs="*", help="extra verl keys for both sides (key=value)")
    return p


# ------------------------------------------------------------------------------------------------ the job
def prepare(args, folder: str) -> list[str]:
    """Write the job's data and reward file under ``folder``; return the verl overrides both sides run."""
    os.makedirs(folder, exist_ok=True)
    val = None
    if args.model.startswith("shape:"):
        import torch

        model = os.path.join(folder, "model")
        if not os.path.isfile(os.path.join(model, "config.json")):
            save_random_model(model, args.model[6:], dtype=torch.bfloat16)
        generator = torch.Generator().manual_seed(0)
        rows = [{"data_source": "bench_random",
                 "prompt": [{"role": "user", "content": "".join(
                     chr(97 + int(c)) for c in torch.randint(0, 26, (args.prompt_length,), generator=generator))}],
                 "reward_model": {"style": "rule", "ground_truth": "0"}, "extra_info": {"index": i}}
                for i in range(args.prompts * args.steps)]
        max_prompt = args.prompt_length + 32  # the chat template's tokens around the text
    else:
        model = resolve_model_path(args.model)
        rows = read_rows(resolve_builtin("builtin://arith/train"))[: args.prompts * args.steps]
        if len(rows) < args.prompts * args.steps:
            raise ValueError(f"builtin://arith/train has {len(rows)} rows; --prompts x --steps needs "
                             f"{args.prompts * args.steps}")
        if args.val_rows:
            val = write_parquet(read_rows(resolve_builtin("builtin://arith/test"))[: args.val_rows],
                                os.path.join(folder, "val.parquet"))
        max_prompt = args.prompt_length
    train = write_parquet(rows, os.path.join(folder, "train.parquet"))
    _write_trl_rows(rows, os.path.join(folder, "train.jsonl"))
    if val:
        _write_trl_rows(read_rows(val), os.path.join(folder, "heldout.jsonl"))
    reward = os.path.join(folder, "reward.py")
    with open(reward, "w", encoding="utf-8") as fh:
        fh.write(REWARD_FILE)
    overrides = [
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
        f"data.train_files={train}", f"data.val_files={val or train}", f"data.train_batch_size={args.prompts}",
        f"data.max_prompt_length={max_prompt}", f"data.max_response_length={args.response_length}",
        "data.filter_overlong_prompts=False", "data.truncation=error", "data.shuffle=False",
        f"actor_rollout_ref.model.path={model}", *padding_overrides(args.padding),
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.strategy=fsdp2", f"actor_rollout_ref.actor.optim.lr={args.lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}", "actor_rollout_ref.actor.ppo_epochs=1",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro_batch}",
        "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.name=vllm", f"actor_rollout_ref.rollout.n={args.n}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        "actor_rollout_ref.rollout.free_cache_engine=True",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.micro_batch}",
        f"actor_rollout_ref.rollout.ignore_eos={bool(args.ignore_eos)}",
        f"reward.custom_reward_function.path={reward}", "reward.custom_reward_function.name=compute_score",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.critic_warmup=0",
        f"trainer.total_training_steps={args.steps}", "trainer.total_epochs=1", "trainer.save_freq=-1",
        "trainer.project_name=bench_verl",
    ]
    if val:
        overrides += ["trainer.val_before_train=True", f"trainer.test_freq={args.steps}",
                      "actor_rollout_ref.rollout.val_kwargs.do_sample=False",
                      "actor_rollout_ref.rollout.val_kwargs.n=1"]
    else:
        overrides += ["trainer.val_before_train=False", "trainer.test_freq=-1"]
    return overrides + list(args.overrides)


def _write_trl_rows(rows: list[dict], path: str) -> None:
    """The job's rows as TRL's side reads them (chat messages + the answer its reward scores)."""
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps({"prompt": [dict(m) for m in row["prompt"]],
                                 "answer": str(row["reward_model"]["ground_truth"])}) + "\n")


def trl_settings(args, max_prompt: int) -> dict:
    """TRL's side of the job (npu_rl/commands/bench_trl_side.py builds its GRPOConfig from these): the same sizes,
    learning rate and micro-batches; fp32 master weights with bf16 compute (both other sides' default: the model
    loaded in fp32, ``bf16=True``); vLLM colocate with sleep mode and the same memory share; no KL term, one update
    per batch."""
    batch = args.prompts * args.n
    return {"prompts": args.prompts, "n": args.n, "response_length": args.response_length, "steps": args.steps,
            "lr": args.lr, "load_dtype": "float32", "bf16": True, "micro_batch": args.micro_batch,
            "gradient_accumulation_steps": batch // args.micro_batch, "ignore_eos": bool(args.ignore_eos),
            "heldout": not args.model.startswith("shape:") and args.val_rows > 0,
            "use_vllm": args.trl_engine == "vllm",
            "gpu_memory_utilization": args.gpu_memory_utilization, "sleep": True,
            "max_model_length": max_prompt + args.response_length}


def padding_overrides(padding: str) -> list[str]:
    """Both sides' attention recipe. verl packs (``use_remove_padding``) only through the flash-attn 2 package (its
    model config asks for ``flash_attention_2``); without it, both sides run padded batches with SDPA."""
    if padding == "auto":
        padding = "packed" if importlib.util.find_spec("flash_attn") is not None else "padded"
    if padding == "packed":
        return ["actor_rollout_ref.model.use_remove_padding=True"]
    return ["actor_rollout_ref.model.use_remove_padding=False",
            "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"]


def side_command(side: str, overrides: list[str], run_dir: str, trl: dict | None = None
                 ) -> tuple[list[str], dict[str, str]]:
    """The command line and extra environment of one side's run, its metrics written under ``run_dir``; ``trl``:
    the TRL side's ``settings`` (:func:`trl_settings`) and ``site`` (a folder put on its path only, or None)."""
    caches = os.path.join(os.path.dirname(run_dir), f"caches-{side}")  # one per side, kept across its runs
    env = {variable: os.path.join(caches, name) for variable, name in CACHE_VARIABLES.items()}
    env["PYTHONUNBUFFERED"] = "1"
    name = os.path.basename(run_dir)
    if side == "trl":
        if trl is None:
            raise ValueError("the trl side needs its settings (trl_settings)")
        folder = os.path.dirname(run_dir)
        model = next(o.split("=", 1)[1] for o in overrides if o.startswith("actor_rollout_ref.model.path="))
        files = {"model": model, "train": os.path.join(folder, "train.jsonl"),
                 "heldout": os.path.join(folder, "heldout.jsonl")}
        if trl.get("site"):
            env["PYTHONPATH"] = os.pathsep.join(p for p in (trl["site"], os.environ.get("PYTHONPATH")) if p)
        return ([sys.executable, "-m", "npu_rl.commands.bench_trl_side", "--files", json.dumps(files),
                 "--folder", run_dir, "--settings", json.dumps(trl["settings"])], env)
    if side == "verl":
        env["VERL_FILE_LOGGER_PATH"] = os.path.join(run_dir, "metrics.jsonl")
        return ([sys.executable, "-m", "verl.trainer.main_ppo", *overrides, "trainer.logger=[console,file]",
                 f"trainer.experiment_name={name}", f"trainer.default_local_dir={run_dir}"], env)
    # verl's entry point and defaults (config ppo_trainer), as a verl script run with the module name changed
    return ([sys.executable, "-m", "npu_rl.trainer.main_ppo", *overrides, "trainer.logger=[console,file]",
             f"trainer.experiment_name={name}", f"trainer.default_local_dir={run_dir}", "trainer.resume_mode=disable"],
            env)


# ------------------------------------------------------------------------------------------------ the figures
def read_metrics(side: str, run_dir: str) -> list[dict]:
    """One dict per logged step (``step`` plus the metrics), from either side's metrics file in ``run_dir``."""
    path = next((os.path.join(d, "metrics.jsonl") for d, _, files in os.walk(run_dir) if "metrics.jsonl" in files),
                None)
    if path is None:
        raise FileNotFoundError(f"the {side} side wrote no metrics.jsonl under {run_dir}")
    records = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if side == "verl":  # verl's FileLogger: {"step": N, "data": {...}}
                if not isinstance(row.get("data"), dict):
                    raise ValueError(f"{path}:{number}: expected verl's {{'step': N, 'data': {{...}}}}")
                row = {"step": row.get("step"), **row["data"]}
            records.append(row)
    return records


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(side: str, records: list[dict], wall_s: float) -> dict:
    """Wall time, step times, tokens/s/GPU, phase medians, peak memory and held-out scores of one run."""
    steps = sorted((r for r in records if "timing_s/step" in r), key=lambda r: r["step"])
    later = steps[1:] or steps
    out = {"side": side, "wall_s": wall_s, "num_steps": len(steps),
           "first_step_s": steps[0]["timing_s/step"] if steps else float("nan"),
           "steady_step_s": _median([r["timing_s/step"] for r in later]),
           "tokens_per_s_per_gpu": _median([r["perf/throughput"] for r in later if "perf/throughput" in r]),
           "peak_memory_gb": max((r[PEAK_KEY[side]] for r in steps if PEAK_KEY[side] in r), default=float("nan")),
           "peak_memory_scope": PEAK_SCOPE[side], "phases_s": {}}
    for label, verl_key, our_key in PHASES:
        key = verl_key if side == "verl" else our_key
        values = [r[key] for r in later if key in r]
        if values:
            out["phases_s"][label] = _median(values)
    validations = sorted((r for r in records if any(k.startswith("val-core/") for k in r)), key=lambda r: r["step"])
    if validations:
        def score(r):
            keys = sorted(k for k in r if k.startswith("val-core/"))
            return {k.removeprefix("val-core/"): r[k] for k in keys}
        out["held_out_before"] = score(validations[0]) if len(validations) > 1 else None
        out["held_out_after"] = score(validations[-1])
    return out


def summarize_trl(result: dict, wall_s: float) -> dict:
    """TRL's side in the report's terms, from its ``result.json`` (npu_rl/commands/bench_trl_side.py): step times
    from its callbacks, tokens/s from its token counts (prompt + completion, no padding, as verl's
    ``perf/throughput``), the peak of torch's allocator (vLLM's pool in sleep mode is outside it), held-out
    accuracy. TRL logs no phases."""
    steps, tokens = result["step_times_s"], result.get("tokens_per_step", [])
    later = list(range(1, len(steps))) or list(range(len(steps)))
    out = {"side": "trl", "wall_s": wall_s, "num_steps": len(steps),
           "first_step_s": steps[0] if steps else float("nan"),
           "steady_step_s": _median([steps[i] for i in later]),
           "tokens_per_s_per_gpu": _median([tokens[i] / steps[i] for i in later if i < len(tokens) and steps[i]]),
           "peak_memory_gb": result.get("peak_memory_gb", float("nan")) or float("nan"),
           "peak_memory_scope": PEAK_SCOPE["trl"], "phases_s": {}}
    if "heldout_after" in result:
        out["held_out_before"] = {"acc/mean@1": result["heldout_before"]} if "heldout_before" in result else None
        out["held_out_after"] = {"acc/mean@1": result["heldout_after"]}
    return out


_ERROR_LINE = re.compile(r"\b([A-Za-z_.]*(?:Error|Exception)): (.+)")


def first_error(log_text: str) -> str | None:
    """The first ``SomeError: message`` line of a side's log (Ray's worker prefix and warnings left out): a run whose
    own last words are a consequence (verl: "Sync replay buffer selected terminal groups with no materializable
    trajectories" after every rollout failed in its agent loop) still names the cause."""
    for line in log_text.splitlines():
        if "Warning" in line:
            continue
        match = _ERROR_LINE.search(line)
        if match:
            return f"{match.group(1)}: {match.group(2).strip()}"
    return None


def run_side(side: str, overrides: list[str], folder: str, run: int, timeout: float, trl: dict | None = None
             ) -> dict:
    run_dir = os.path.join(folder, f"{side}-run{run}")
    command, env = side_command(side, overrides, run_dir, trl)
    os.makedirs(run_dir, exist_ok=True)
    log = os.path.join(folder, f"{side}-run{run}.log")
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as fh:
        try:
            code = subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **env},
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    wall = time.perf_counter() - start
    if code != 0:
        with open(log, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        first = first_error(text)
        raise RuntimeError(f"the {side} side's run {run} failed (exit {code}) after {wall:.0f} s; its log: {log}\n"
                           + (f"first error in the log: {first}\n" if first else "") + text[-2500:])
    if side == "trl":
        with open(os.path.join(run_dir, "result.json"), encoding="utf-8") as fh:
            result = summarize_trl(json.load(fh), wall)
        result["engine"] = "vllm" if trl["settings"]["use_vllm"] else "hf"  # the report names TRL's rollout
    else:
        result = summarize(side, read_metrics(side, run_dir), wall)
    result["run"], result["warm"], result["log"] = run, run > 1, log
    return result


RESULTS_FILE = "results.jsonl"


def _job_key(overrides: list[str]) -> str:
    return hashlib.sha256("\n".join(overrides).encode()).hexdigest()[:16]


def record_run(folder: str, overrides: list[str], result: dict) -> None:
    """Keep a finished run in the bench folder, so that a later invocation of the same job reports it too (the sides
    of a large row can then run in separate device calls, each under the device's per-call limit)."""
    with open(os.path.join(folder, RESULTS_FILE), "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"job": _job_key(overrides), **result}) + "\n")


def earlier_runs(folder: str, overrides: list[str]) -> list[dict]:
    """The runs of this very job (the same overrides) recorded in ``folder``; runs of another job are left out."""
    path = os.path.join(folder, RESULTS_FILE)
    if not os.path.isfile(path):
        return []
    key, runs = _job_key(overrides), []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            try:
                row = json.loads(line)
            except ValueError:
                raise ValueError(f"{path}:{number}: not a JSON line; move the file away to start this job "
                                 "over") from None
            if row.pop("job", None) == key:
                runs.append(row)
    return runs


def render(results: list[dict], args) -> str:
    def f(x, digits=2):
        return "-" if x is None or x != x else f"{x:.{digits}f}"

    def held(r, key):
        scores = r.get(key)
        return "-" if not scores else ", ".join(f"{v:.3f}" for k, v in scores.items() if "mean@" in k) or "-"

    lines = [f"{args.model}: {args.prompts} prompts x {args.n} samples, {args.prompt_length} + {args.response_length}"
             f" tokens, {args.steps} steps, micro-batch {args.micro_batch}, {args.padding}",
             "| side | run | wall s | first step s | steady step s | tokens/s/GPU | peak GiB | gen | old_log_prob "
             "| update_actor | weight sync | held-out before -> after |", "|" + "---|" * 12]
    for r in results:
        p = r["phases_s"]
        side = f"{r['side']} ({r['engine']})" if "engine" in r else r["side"]
        lines.append(f"| {side} | {'warm' if r['warm'] else 'cold'} | {f(r['wall_s'], 1)} | "
                     f"{f(r['first_step_s'])} | {f(r['steady_step_s'])} | {f(r['tokens_per_s_per_gpu'], 0)} | "
                     f"{f(r['peak_memory_gb'], 1)} | {f(p.get('gen'))} | {f(p.get('old_log_prob'))} | "
                     f"{f(p.get('update_actor'))} | {f(p.get('weight_sync'))} | "
                     f"{held(r, 'held_out_before')} -> {held(r, 'held_out_after')} |")
    def ratio(a, b):
        return "-" if not (a == a and b == b and b) else f"{a / b:.2f}x"

    def peak_ratio(o, v):
        if o.get("peak_memory_scope") != v.get("peak_memory_scope"):
            return "not comparable (see peak GiB above)"
        return ratio(o["peak_memory_gb"], v["peak_memory_gb"])

    scopes = {r["side"]: r["peak_memory_scope"] for r in results if r.get("peak_memory_scope")}
    if scopes:
        lines.append("peak GiB: torch's allocator, " + "; ".join(f"{side}: {scope}" for side, scope in scopes.items()))

    for warm in (False, True):
        pair = {r["side"]: r for r in results if r["warm"] == warm}
        for other in ("verl", "trl"):
            if "ours" in pair and other in pair:
                o, v = pair["ours"], pair[other]
                lines.append(f"ours / {other} ({'warm' if warm else 'cold'}): wall {ratio(o['wall_s'], v['wall_s'])}, "
                             f"steady step {ratio(o['steady_step_s'], v['steady_step_s'])}, tokens/s/GPU "
                             f"{ratio(o['tokens_per_s_per_gpu'], v['tokens_per_s_per_gpu'])}, peak memory "
                             f"{peak_ratio(o, v)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = [s for s in sides if s not in SIDES]
    if unknown or not sides:
        print(f"npu-rl bench verl: --sides takes {', '.join(SIDES)}, got {args.sides!r}", file=sys.stderr)
        return 2
    if "trl" in sides and (args.prompts * args.n) % args.micro_batch:
        print(f"npu-rl bench verl: --micro-batch {args.micro_batch} must divide --prompts x --n = "
              f"{args.prompts * args.n} (TRL's gradient accumulation)", file=sys.stderr)
        return 2
    if "trl" in sides and not (os.path.isdir(os.path.join(args.trl_site or "", "trl")) if args.trl_site
                               else importlib.util.find_spec("trl") is not None):
        print(f"npu-rl bench verl: TRL is not installed{' in --trl-site ' + args.trl_site if args.trl_site else ''} "
              "(pip install trl==1.16.0; apart from verl: pip install --target DIR, then --trl-site DIR)",
              file=sys.stderr)
        return 2
    if "verl" in sides and importlib.util.find_spec("verl") is None:
        print("npu-rl bench verl: verl is not installed (pip install verl; on the H200: WITH_VERL=1 "
              "scripts/gpu/carry_vllm.sh)", file=sys.stderr)
        return 2
    if args.padding == "auto":
        args.padding = "packed" if importlib.util.find_spec("flash_attn") is not None else "padded"
    folder = args.dir or tempfile.mkdtemp(prefix="npu-rl-bench-verl-")
    try:
        overrides = prepare(args, folder)
        earlier_runs(folder, overrides)  # a damaged results file is named before anything runs
    except (ValueError, FileNotFoundError) as exc:
        print(f"npu-rl bench verl: {exc}", file=sys.stderr)
        return 2
    max_prompt = int(next(o.split("=", 1)[1] for o in overrides if o.startswith("data.max_prompt_length=")))
    trl = {"settings": trl_settings(args, max_prompt), "site": args.trl_site}
    results, failures = earlier_runs(folder, overrides), []
    if results:
        print(f"bench verl: {len(results)} earlier run(s) of this job in {folder} join the report", flush=True)
    for repeat in range(args.repeat):
        for side in sides:
            run = 1 + sum(r["side"] == side for r in results)  # a side's first run in this folder is its cold one
            try:
                results.append(run_side(side, overrides, folder, run, args.timeout, trl))
            except (RuntimeError, FileNotFoundError, ValueError) as exc:  # the other side still runs
                print(f"npu-rl bench verl: {exc}", file=sys.stderr, flush=True)
                failures.append({"side": side, "run": run, "error": str(exc)[:4000]})
                continue
            record_run(folder, overrides, results[-1])
            print(f"bench verl: {side} run {run}: wall {results[-1]['wall_s']:.1f} s, steady step "
                  f"{results[-1]['steady_step_s']:.2f} s", flush=True)
    if results:
        print(render(results, args))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"args": vars(args), "overrides": overrides, "results": results, "failures": failures}, fh,
                      indent=2)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
