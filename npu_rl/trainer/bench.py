"""``npu-rl bench trainer``: GRPO steps of a real architecture with random weights; the step's time breakdown,
MFU and peak memory, for the plain log-prob path and the fused kernels, in one run.

    npu-rl bench trainer --shape qwen2.5-0.5b --prompts 16 --n 4 --prompt-length 128 --response-length 256

Responses run to full length (``rollout.ignore_eos``), so every step handles prompts x n x (prompt + response)
tokens. The first step is a warm-up and is left out of the averages. Rollouts use the engine ``--engine`` names
(HF generate where vLLM is not installed). Extra ``key=value`` arguments are config overrides.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

COLUMNS = [("timing_s/step", "step s"), ("timing_s/gen", "gen s"), ("timing_s/old_log_prob", "old logp s"),
           ("timing_s/ref", "ref s"), ("timing_s/update_actor", "update s"), ("perf/throughput", "tokens/s"),
           ("perf/mfu/actor", "MFU (update)"), ("perf/max_memory_allocated_gb", "peak GiB")]
MODES = {"naive": ["actor_rollout_ref.model.use_fused_kernels=False"],
         "fused": ["actor_rollout_ref.model.use_fused_kernels=True",
                   "actor_rollout_ref.model.fused_kernel_options.impl_backend=auto"]}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="npu-rl bench trainer", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen2.5-0.5b", help="tiny | qwen2.5-0.5b | qwen2.5-1.5b | qwen2.5-7b")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--prompt-length", type=int, default=128)
    p.add_argument("--response-length", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=None, help="rows per micro-batch (default: all)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--modes", default="naive,fused")
    p.add_argument("--engine", default="vllm", choices=("vllm", "hf"))
    p.add_argument("--model-dir", default=None, help="where to write the random model (default: a temp folder)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("overrides", nargs="*")
    return p


def _prompt_data(args, folder: str) -> str:
    """Prompts of exactly ``prompt_length`` tokens with the char tokenizer (one token per character)."""
    from npu_rl.data.io import write_parquet
    from npu_rl.models.synthetic import char_tokenizer

    count = args.prompts * args.steps
    overhead = len(char_tokenizer().apply_chat_template([{"role": "user", "content": ""}], tokenize=False,
                                                        add_generation_prompt=True))
    overhead -= 2 * (len("<|im_start|>") - 1) + len("<|im_end|>") - 1  # each special token is one id
    text = "x" * max(1, args.prompt_length - overhead)
    rows = [{"data_source": "arith", "prompt": [{"role": "user", "content": text}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": "1"}, "extra_info": {"index": i}} for i in range(count)]
    return write_parquet(rows, os.path.join(folder, "prompts.parquet"))


def _overrides(args, model_dir: str, data: str, out_dir: str) -> list[str]:
    rows = args.prompts * args.n
    micro = args.micro_batch or rows
    return [
        "preset=grpo", f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={data}", f"data.val_files={data}",
        f"data.train_batch_size={args.prompts}", f"data.max_prompt_length={args.prompt_length}",
        f"data.max_response_length={args.response_length}", "data.dataloader_num_workers=0", "data.truncation=left",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}", f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.name={args.engine}", "actor_rollout_ref.rollout.ignore_eos=True",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.actor.use_torch_compile=False",
        "trainer.n_gpus_per_node=1", f"trainer.total_training_steps={args.steps}", "trainer.val_before_train=False",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[file]", "trainer.progress_bar=False",
        "trainer.balance_batch=False", f"trainer.default_local_dir={out_dir}", "trainer.resume_mode=disable",
        *args.overrides,
    ]


def _averages(jsonl: str) -> dict[str, float]:
    with open(jsonl, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    rows = [r for r in rows if "timing_s/step" in r]
    kept = rows[1:] or rows  # the first step warms up kernels and allocators
    return {key: sum(r.get(key, 0.0) for r in kept) / len(kept) for key, _ in COLUMNS} | {
        "peak_all_steps_gb": max(r.get("perf/max_memory_allocated_gb", 0.0) for r in rows)}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from npu_rl.config.loader import load_config
    from npu_rl.device import get_backend
    from npu_rl.models.synthetic import save_random_model
    from npu_rl.trainer.run import run

    backend = get_backend()
    work = tempfile.mkdtemp(prefix="npu_rl_bench_")
    model_dir = args.model_dir or os.path.join(work, f"model-{args.shape}")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        save_random_model(model_dir, args.shape)
    data = _prompt_data(args, work)
    results = {"shape": args.shape, "device": backend.device_name(), "sequences": args.prompts * args.n,
               "tokens_per_sequence": args.prompt_length + args.response_length, "modes": {}}
    for mode in args.modes.split(","):
        out_dir = os.path.join(work, mode)
        code = run(load_config(_overrides(args, model_dir, data, out_dir) + MODES[mode], "ppo_trainer"))
        if code:
            return code
        jsonl = next(os.path.join(root, f) for root, _, files in os.walk(out_dir) for f in files
                     if f == "metrics.jsonl")
        results["modes"][mode] = _averages(jsonl)
        backend.empty_cache()
    _print_table(results)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return 0


def _print_table(results: dict) -> None:
    print(f"\n{results['shape']} on {results['device']}: {results['sequences']} sequences x "
          f"{results['tokens_per_sequence']} tokens per step (averages over steps 2..N)")
    print("| mode | " + " | ".join(name for _, name in COLUMNS) + " |")
    print("|" + "---|" * (len(COLUMNS) + 1))
    for mode, values in results["modes"].items():
        cells = [f"{values[key]:.3g}" if key != "perf/mfu/actor" else f"{100 * values[key]:.1f}%" for key, _ in COLUMNS]
        print(f"| {mode} | " + " | ".join(cells) + " |")
    sys.stdout.flush()
