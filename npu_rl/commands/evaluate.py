"""``npu-rl eval MODEL --task gsm8k``: accuracy and pass@k of a model folder, a built-in model or a checkpoint.

The task's JSONL (shipped in the package, or ``--data-dir``) is converted to verl's schema, prompted with the
model's chat template, sampled ``--n`` times per problem (greedy by default) with the rollout engine (vLLM when
installed, else Hugging Face generate), and scored by the same rule scorers the trainer uses. pass@k uses the
unbiased estimator of Chen et al. 2021: 1 - C(n - c, k) / C(n, k) per problem, averaged.

GSM8K is scored both ways (``accuracy`` is the trainer's rule, strict, as verl's): ``strict`` takes the number after
the last ``####``, ``flexible`` the last number anywhere; a model that answers right without the ``####`` format
scores 0 strict and > 0 flexible. The output shows ``--samples`` responses (problem tail, response, answer, scores)
so a score of 0 can be told apart from a broken prompt. The hf engine decodes eagerly here: an eval's batches come
in many shapes (the last one, and every length bucket), and compiled decoding compiles each shape anew (measured on
an H200: 67 s against 36 s for 256 problems).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

import numpy as np

from npu_rl.commands.merge import merge_lora, merge_source, resolve_checkpoint
from npu_rl.config.loader import ConfigError
from npu_rl.data.builtin import resolve_builtin
from npu_rl.data.io import read_rows, write_parquet
from npu_rl.data.loader import build_dataloader
from npu_rl.models.check import check_model_folder
from npu_rl.models.loader import is_builtin, load_tokenizer, resolve_model_path, stop_token_ids
from npu_rl.reward import build_reward_manager
from npu_rl.reward.scorers import gsm8k_score
from npu_rl.rollout.factory import build_rollout_engine, sampling_params_from_config
from npu_rl.trainer.preflight import load_checked
from npu_rl.trainer.sampling import score_batch
from npu_rl.utils.paths import check_output_file

TASKS = ("gsm8k", "math500", "aime24", "arith")


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n is correct."""
    if num_samples - num_correct < k:
        return 1.0
    return 1.0 - math.comb(num_samples - num_correct, k) / math.comb(num_samples, k)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="npu-rl eval", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="HF folder, Hub id (owner/name[@revision]), ModelScope id (modelscope://owner/name), "
                              "built-in name (smollm2-135m-instruct), or a checkpoint folder")
    p.add_argument("--task", required=True, choices=TASKS)
    p.add_argument("--adapter", default=None, help="a PEFT LoRA adapter folder applied to MODEL (merged for the run)")
    p.add_argument("--split", default="test")
    p.add_argument("--data-dir", default=None, help="folder with gsm8k/ math500/ aime24/ JSONL (default: the copies shipped in the package)")
    p.add_argument("--n", type=int, default=1, help="samples per problem")
    p.add_argument("--k", default=None, help="comma-separated k values for pass@k (default: 1 and n)")
    p.add_argument("--temperature", type=float, default=None, help="default: 0 (greedy) when n=1, else 1.0")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--max-prompt-length", type=int, default=1024)
    p.add_argument("--limit", type=int, default=None, help="only the first N problems")
    p.add_argument("--engine", default="vllm", choices=("vllm", "hf"))
    p.add_argument("--batch-size", type=int, default=64, help="problems per generation batch")
    p.add_argument("--samples", type=int, default=3, help="responses shown in the output (and kept in --out)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("overrides", nargs="*", help="extra config overrides (verl keys), e.g. actor_rollout_ref.rollout."
                                                "gpu_memory_utilization=0.8")
    return p


def _task_file(task: str, split: str, data_dir: str | None, limit: int | None, tmp: str) -> str:
    """The task's split as a verl-schema parquet file (through the builtin:// data sets: the same conversion the
    trainer uses), cut to the first ``limit`` problems."""
    uri = f"builtin://{task}/{split}" + (f"?data_dir={data_dir}" if data_dir and task != "arith" else "")
    path = resolve_builtin(uri)
    if not limit:
        return path
    return write_parquet(read_rows(path)[:limit], os.path.join(tmp, f"{task}_{split}.parquet"))


def _model_folder(model: str, tmp: str, adapter: str | None = None) -> str:
    """A checkpoint (full or LoRA), or a base model plus ``adapter``, is merged into a temporary HF folder first
    (what every rollout engine loads); a Hub or ModelScope id is its snapshot's folder; anything else is used as
    is."""
    if adapter:
        return merge_lora(model, adapter, os.path.join(tmp, "merged"))

    try:
        source = resolve_checkpoint(model, "actor")
    except FileNotFoundError:
        if not os.path.exists(os.path.expanduser(model)) and not is_builtin(model):
            model = resolve_model_path(model)  # a Hub or ModelScope id: its snapshot, downloaded once per node
        check_model_folder(model, "model")  # the trainer's checks and words
        return model
    return merge_source(source, os.path.join(tmp, "merged"))


def evaluate(args) -> dict:
    temperature = args.temperature if args.temperature is not None else (0.0 if args.n == 1 else 1.0)
    with tempfile.TemporaryDirectory(prefix="npu_rl_eval_") as tmp:
        data_file = _task_file(args.task, args.split, args.data_dir, args.limit, tmp)
        model = _model_folder(args.model, tmp, args.adapter)
        config = _eval_config(args, model, data_file, temperature)
        rollout_cfg = config.actor_rollout_ref.rollout
        tokenizer = load_tokenizer(model)
        # eager hf decoding: compiled decoding compiles each batch shape (module docstring)
        engine = build_rollout_engine(rollout_cfg, model, None, tokenizer, allow_compile=False)
        sampling = sampling_params_from_config(rollout_cfg, True, args.max_new_tokens, stop_token_ids(tokenizer, model),
                                               logprobs=False)
        reward_fn = build_reward_manager(config, tokenizer, validation=True)
        correct: dict[str, list[float]] = {}
        flexible: list[float] = []
        samples: list[dict] = []
        start, num_tokens = time.perf_counter(), 0
        for prompts in build_dataloader(config.data, tokenizer, "val"):
            out, _ = score_batch(engine.generate(prompts, sampling).batch, reward_fn)
            num_tokens += int(out["response_mask"].sum())
            acc = np.asarray(out["acc"], dtype=float) if "acc" in out else out["token_level_scores"].sum(-1).numpy()
            for uid, value in zip(out["uid"], acc):
                correct.setdefault(uid, []).append(float(value))
            texts = None
            if args.task == "gsm8k" or len(samples) < args.samples:
                texts = response_texts(out, tokenizer)
            if args.task == "gsm8k":
                flexible += [gsm8k_score(t, gt, method="flexible")["acc"] for t, gt in zip(texts, out["ground_truth"])]
            for i in range(min(args.samples - len(samples), len(texts or []))):
                samples.append(sample_record(out, i, texts[i], tokenizer, float(acc[i]), args.task))
        seconds = time.perf_counter() - start
    ks = sorted({int(k) for k in args.k.split(",")} if args.k else {1, args.n})
    results = {"model": args.model, "task": args.task, "split": args.split, "num_problems": len(correct),
               "n": args.n, "temperature": temperature, "accuracy": float(np.mean([np.mean(v) for v in correct.values()])),
               "seconds": seconds, "generated_tokens": num_tokens}
    if args.task == "gsm8k":
        results["accuracy_strict"] = results["accuracy"]
        results["accuracy_flexible"] = float(np.mean(flexible)) if flexible else 0.0
    for k in ks:
        if k <= args.n:
            results[f"pass@{k}"] = float(np.mean([pass_at_k(len(v), int(sum(x > 0.5 for x in v)), k)
                                                  for v in correct.values()]))
    results["samples"] = samples
    return results


def response_texts(batch, tokenizer) -> list[str]:
    """Each row's response up to its mask (what the scorers read), without special tokens."""
    lengths = batch["response_mask"].sum(-1).tolist()
    return [tokenizer.decode(row[:int(n)].tolist(), skip_special_tokens=True)
            for row, n in zip(batch["responses"], lengths)]


def sample_record(batch, i: int, text: str, tokenizer, acc: float, task: str) -> dict:
    """One shown sample: the prompt's last 200 characters, the response, the reference answer, the score(s)."""
    prompt = batch["prompts"][i]  # input_ids holds prompt + response
    prompt_ids = prompt[batch["attention_mask"][i][: prompt.shape[0]].bool()].tolist()
    record = {"prompt_tail": tokenizer.decode(prompt_ids, skip_special_tokens=True)[-200:], "response": text,
              "ground_truth": str(batch["ground_truth"][i]), "score": acc}
    if task == "gsm8k":
        record["flexible"] = gsm8k_score(text, batch["ground_truth"][i], method="flexible")["acc"]
    return record


def format_samples(samples: list[dict]) -> str:
    lines = []
    for k, s in enumerate(samples, 1):
        scores = f"score {s['score']:g}" + (f", flexible {s['flexible']:g}" if "flexible" in s else "")
        lines += [f"--- sample {k} ({scores}; answer {s['ground_truth']})", f"... {s['prompt_tail']}",
                  f">>> {s['response']}"]
    return "\n".join(lines)


def _eval_config(args, model: str, data_file: str, temperature: float):
    return load_checked([
        f"actor_rollout_ref.model.path={model}", f"data.val_files={data_file}", f"data.train_files={data_file}",
        f"data.max_prompt_length={args.max_prompt_length}", f"data.max_response_length={args.max_new_tokens}",
        f"data.val_batch_size={args.batch_size}", "data.truncation=left", "data.dataloader_num_workers=0",
        f"actor_rollout_ref.rollout.name={args.engine}", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.val_kwargs.n={args.n}",
        f"actor_rollout_ref.rollout.val_kwargs.temperature={temperature}",
        f"actor_rollout_ref.rollout.val_kwargs.top_p={args.top_p}",
        f"actor_rollout_ref.rollout.val_kwargs.do_sample={temperature > 0}",
        "actor_rollout_ref.rollout.free_cache_engine=False", "actor_rollout_ref.rollout.load_format=auto",
        "trainer.n_gpus_per_node=1",
        "algorithm.adv_estimator=grpo", *args.overrides,
    ])


def check_args(args) -> None:
    """Arguments that would silently change what is measured, or fail only after the whole eval: refused now."""
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit {args.limit}: give a positive number of problems (leave it out for all)")
    if args.n < 1:
        raise ValueError(f"--n {args.n}: give at least one sample per problem")
    if args.k:
        try:
            ks = [int(k) for k in args.k.split(",")]
        except ValueError:
            raise ValueError(f"--k {args.k!r}: give comma-separated positive integers, e.g. 1,5") from None
        too_big = [k for k in ks if k > args.n]
        if too_big or any(k < 1 for k in ks):
            raise ValueError(f"--k {args.k}: pass@k needs 1 <= k <= --n (={args.n}); raise --n to {max(ks)} or drop "
                             f"{too_big or [k for k in ks if k < 1]}")
    if args.out:
        check_output_file(args.out, "--out")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    try:
        check_args(args)
        results = evaluate(args)
    except (ConfigError, OSError, ValueError, ImportError) as exc:  # ImportError: pip install modelscope
        print(f"npu-rl eval: {exc}", file=sys.stderr)
        return 2
    if results["samples"]:  # for the reader, on stderr: stdout stays one JSON document (`npu-rl eval ... > r.json`)
        print(format_samples(results["samples"]), file=sys.stderr)
    print(json.dumps({k: v for k, v in results.items() if k != "samples"}, indent=2))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return 0
