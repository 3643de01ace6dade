"""``npu-rl bench trainer``: GRPO steps of a real architecture with random weights; the step's time breakdown,
MFU and peak memory (max over ranks and per rank), for several update paths and device counts, in one run.

    npu-rl bench trainer --shape qwen2.5-0.5b --prompts 16 --n 4 --prompt-length 128 --response-length 256
    npu-rl bench trainer --engine hf --modes fused --devices 1,2 --scaling both   # scaling against one device

Responses run to full length (``rollout.ignore_eos``), so every step handles prompts x n x (prompt + response)
tokens. The first step is a warm-up and is left out of the averages. Rollouts use the engine ``--engine`` names
(HF generate where vLLM is not installed). Extra ``key=value`` arguments are config overrides.

Modes: ``naive`` (plain log-probs), ``fused`` (fused log-prob kernels), ``packed`` (fused + remove-padding),
``nockpt`` / ``packed_nockpt`` (the same without gradient checkpointing); ``fused_eager`` / ``nockpt_eager``: with
``actor.use_torch_compile=False`` (no compiled RMSNorm / MLP blocks where the device layer would compile them).

Devices (``--devices 1,2``): one device runs in-process; more run through Ray (one worker per device). Scaling:
``strong`` keeps the global batch (``--prompts``), ``weak`` multiplies it by the device count; each multi-device
run is compared with the one-device run of the same mode in this invocation: weak efficiency = total tokens/s of
N devices / (N x tokens/s of one); strong speed-up = step time of one / step time of N. The tokens/s column is
per device (``perf/throughput``, verl's convention).

``--profile DIR`` (one-device runs): the update of step 2 under ``torch.profiler``; DIR gets the top operators by
device time and a summary by category (matmul, attention, elementwise, communication, optimizer, idle). The
profiled step is slower (profiler overhead) and is one of the averaged steps: time a run without ``--profile``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from npu_rl.commands.bench_profile import UpdateProfiler
from npu_rl.config.loader import load_config
from npu_rl.data.io import write_parquet
from npu_rl.device import get_backend
from npu_rl.models.synthetic import char_tokenizer, save_random_model
from npu_rl.parallel.attention import selected_kernel_name
from npu_rl.trainer.run import run as run_training

COLUMNS = [("timing_s/step", "step s"), ("timing_s/gen", "gen s"), ("timing_s/old_log_prob", "old logp s"),
           ("timing_s/ref", "ref s"), ("timing_s/update_actor", "update s"), ("perf/throughput", "tokens/s per device"),
           ("perf/mfu/actor", "MFU (update)"), ("perf/max_memory_allocated_gb", "peak GiB")]
# Kept in --out's JSON (not printed): where the rollout's time goes inside the worker against around it.
DIAGNOSTICS = ["timing_s/generate_sequences", "timing_s/rollout_decode", "rollout/decode_ms_per_step",
               "rollout/host_threads", "rollout/decode_compiled", "timing_s/rollout_unshard",
               "timing_s/rollout_reshard"]
_FUSED = ["actor_rollout_ref.model.use_fused_kernels=True",
          "actor_rollout_ref.model.fused_kernel_options.impl_backend=auto"]
_PACKED = ["actor_rollout_ref.model.use_remove_padding=True"]
_NO_CKPT = ["actor_rollout_ref.model.enable_gradient_checkpointing=False"]
_EAGER = ["actor_rollout_ref.actor.use_torch_compile=False"]
MODES = {"naive": ["actor_rollout_ref.model.use_fused_kernels=False"], "fused": _FUSED, "packed": _FUSED + _PACKED,
         "nockpt": _FUSED + _NO_CKPT, "packed_nockpt": _FUSED + _PACKED + _NO_CKPT,
         "fused_eager": _FUSED + _EAGER, "nockpt_eager": _FUSED + _NO_CKPT + _EAGER}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="npu-rl bench trainer", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen2.5-0.5b", help="tiny | qwen2.5-0.5b | qwen2.5-1.5b | qwen2.5-7b")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--prompt-length", type=int, default=128)
    p.add_argument("--response-length", type=int, default=256)
    p.add_argument("--min-prompt-length", type=int, default=None,
                   help="prompts of lengths spread evenly from this to --prompt-length (default: all the same), so "
                        "batches carry padding that remove-padding can drop")
    p.add_argument("--micro-batch", type=int, default=None, help="rows per micro-batch per device (default: all)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--modes", default="naive,fused", help=f"comma list of {', '.join(MODES)}")
    p.add_argument("--devices", default="1", help="comma list of device counts, e.g. 1,2 (more than 1: Ray)")
    p.add_argument("--scaling", default="strong", choices=("strong", "weak", "both"),
                   help="multi-device runs: same global batch (strong), N x the prompts (weak), or both")
    p.add_argument("--profile", default=None, help="folder for a profile of the update (one-device runs)")
    p.add_argument("--engine", default="vllm", choices=("vllm", "hf"))
    p.add_argument("--model-dir", default=None, help="where to write the random model (default: a temp folder)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("overrides", nargs="*")
    return p


def _prompt_data(args, folder: str, prompts: int) -> str:
    """Prompts of exactly ``prompt_length`` tokens with the char tokenizer (one token per character); with
    ``--min-prompt-length``, lengths spread evenly between the two (row i of every batch gets the same length)."""
    count = prompts * args.steps
    overhead = len(char_tokenizer().apply_chat_template([{"role": "user", "content": ""}], tokenize=False,
                                                        add_generation_prompt=True))
    overhead -= 2 * (len("<|im_start|>") - 1) + len("<|im_end|>") - 1  # each special token is one id
    shortest = args.min_prompt_length or args.prompt_length
    if args.min_prompt_length and not overhead < shortest <= args.prompt_length:
        raise SystemExit(f"npu-rl bench trainer: --min-prompt-length must be in ({overhead}, {args.prompt_length}]")

    def length(i: int) -> int:
        return shortest + (args.prompt_length - shortest) * (i % prompts) // max(prompts - 1, 1)

    rows = [{"data_source": "arith", "prompt": [{"role": "user", "content": "x" * max(1, length(i) - overhead)}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": "1"}, "extra_info": {"index": i}}
            for i in range(count)]
    return write_parquet(rows, os.path.join(folder, f"prompts-{prompts}.parquet"))


def _overrides(args, model_dir: str, data: str, out_dir: str, prompts: int, devices: int) -> list[str]:
    micro = args.micro_batch or prompts * args.n // devices
    return [
        "preset=grpo", f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={data}", f"data.val_files={data}",
        f"data.train_batch_size={prompts}", f"data.max_prompt_length={args.prompt_length}",
        f"data.max_response_length={args.response_length}", "data.dataloader_num_workers=0", "data.truncation=left",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}", f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.name={args.engine}", "actor_rollout_ref.rollout.ignore_eos=True",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"trainer.n_gpus_per_node={devices}", f"trainer.controller={'local' if devices == 1 else 'ray'}",
        f"trainer.total_training_steps={args.steps}", "trainer.val_before_train=False",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[file]", "trainer.progress_bar=False",
        "trainer.balance_batch=False", f"trainer.default_local_dir={out_dir}", "trainer.resume_mode=disable",
        *args.overrides,
    ]


def _averages(jsonl: str) -> dict[str, float]:
    with open(jsonl, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    rows = [r for r in rows if "timing_s/step" in r]
    kept = rows[1:] or rows  # the first step warms up kernels and allocators
    keys = [key for key, _ in COLUMNS] + sorted({k for r in kept for k in r if k.startswith("perf/rank")})
    keys += [key for key in DIAGNOSTICS if any(key in r for r in kept)]
    out = {key: sum(r.get(key, 0.0) for r in kept) / len(kept) for key in keys}
    out["peak_all_steps_gb"] = max(r.get("perf/max_memory_allocated_gb", 0.0) for r in rows)
    out["memory_reports"] = max(r.get("perf/num_memory_reports", 0.0) for r in rows)
    return out


def plan_runs(modes: list[str], devices: list[int], scaling: str, prompts: int) -> list[dict]:
    """(label, mode, devices, prompts, kind) for every run; the one-device run of each mode comes first."""
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"npu-rl bench trainer: unknown mode(s) {unknown}; expected {', '.join(MODES)}")
    runs = []
    for mode in modes:
        for count in sorted(set(devices)):
            kinds = ["single"] if count == 1 else (["strong", "weak"] if scaling == "both" else [scaling])
            for kind in kinds:
                label = mode if count == 1 else f"{mode} x{count} {kind}"
                runs.append({"label": label, "mode": mode, "devices": count, "kind": kind,
                             "prompts": prompts * count if kind == "weak" else prompts})
    return runs


def scaling_figures(results: dict) -> None:
    """Add ``scaling`` to every multi-device run: against the one-device run of the same mode."""
    singles = {r["mode"]: r for r in results["runs"] if r["devices"] == 1 and not r.get("failed")}
    for run in results["runs"]:
        base = singles.get(run["mode"])
        if run["devices"] == 1 or base is None or run.get("failed"):
            continue
        n, values, base_values = run["devices"], run["values"], base["values"]
        if run["kind"] == "weak":  # perf/throughput is per device (verl's convention): total = x devices
            ratio = values["perf/throughput"] * n / base_values["perf/throughput"]
            run["scaling"] = {"tokens_per_s_ratio": ratio, "weak_efficiency": ratio / n}
        else:
            speedup = base_values["timing_s/step"] / values["timing_s/step"]
            run["scaling"] = {"step_speedup": speedup, "strong_efficiency": speedup / n}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    backend = get_backend()
    work = tempfile.mkdtemp(prefix="npu_rl_bench_")
    model_dir = args.model_dir or os.path.join(work, f"model-{args.shape}")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        save_random_model(model_dir, args.shape)
    runs = plan_runs(args.modes.split(","), [int(d) for d in args.devices.split(",")], args.scaling, args.prompts)
    results = {"shape": args.shape, "device": backend.device_name(), "n": args.n,
               "tokens_per_sequence": args.prompt_length + args.response_length, "runs": []}
    for index, spec in enumerate(runs):
        out_dir = os.path.join(work, f"run{index}")
        data = _prompt_data(args, work, spec["prompts"])
        config = load_config(_overrides(args, model_dir, data, out_dir, spec["prompts"], spec["devices"])
                             + MODES[spec["mode"]], "ppo_trainer")
        profiler = None
        if args.profile and spec["devices"] == 1:
            profiler = UpdateProfiler(args.profile, f"{args.shape}_{spec['label']}", call=2)
        try:
            with profiler or _nothing():
                code = run_training(config)
        except Exception:  # one failed configuration must not cost the others (device time is scarce)
            import traceback

            traceback.print_exc()
            code = 1
        if code:
            results["runs"].append({**spec, "failed": True})
            continue
        jsonl = next(os.path.join(root, f) for root, _, files in os.walk(out_dir) for f in files
                     if f == "metrics.jsonl")

        kernel = selected_kernel_name() if spec["devices"] == 1 and "packed" in spec["mode"] else None
        results["runs"].append({**spec, "sequences": spec["prompts"] * args.n, "values": _averages(jsonl),
                                "packed_kernel": kernel})
        backend.empty_cache()
    scaling_figures(results)
    _print_table(results)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return 0


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _print_table(results: dict) -> None:
    print(f"\n{results['shape']} on {results['device']}: n={results['n']}, {results['tokens_per_sequence']} tokens "
          "per sequence (averages over steps 2..N; peak GiB: max over ranks)")
    print("| run | devices | sequences | " + " | ".join(name for _, name in COLUMNS)
          + " | peak GiB per rank | scaling |")
    print("|" + "---|" * (len(COLUMNS) + 5))
    for run in results["runs"]:
        if run.get("failed"):
            print(f"| {run['label']} | {run['devices']} | failed (traceback above) |")
            continue
        values = run["values"]
        cells = [f"{values[key]:.3g}" if key != "perf/mfu/actor" else f"{100 * values[key]:.1f}%" for key, _ in COLUMNS]
        ranks = [values[k] for k in sorted(values) if k.startswith("perf/rank") and
                 k.endswith("/max_memory_allocated_gb")]
        per_rank = " / ".join(f"{v:.3g}" for v in ranks) or f"{values['perf/max_memory_allocated_gb']:.3g}"
        scaling = run.get("scaling", {})
        text = (f"{scaling['tokens_per_s_ratio']:.2f}x tokens/s ({100 * scaling['weak_efficiency']:.0f}% weak)"
                if "weak_efficiency" in scaling else
                f"{scaling['step_speedup']:.2f}x step speed-up ({100 * scaling['strong_efficiency']:.0f}% strong)"
                if "step_speedup" in scaling else "-")
        label = run["label"] + (f" ({run['packed_kernel']})" if run.get("packed_kernel") else "")
        print(f"| {label} | {run['devices']} | {run['sequences']} | " + " | ".join(cells)
              + f" | {per_rank} | {text} |")
    sys.stdout.flush()
