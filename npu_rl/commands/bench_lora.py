"""``python -m npu_rl.commands.bench_lora``: one policy-update step of a real architecture (random weights, built on
the device, nothing written to disk) with LoRA vs full fine-tuning: step time and peak device memory side by side.

    python -m npu_rl.commands.bench_lora --shape qwen2.5-7b --rows 8 --prompt-length 256 --response-length 768

Each mode builds the model the way the actor does (``npu_rl.workers.actor.LogprobModel``) and runs the actor's
pieces: ``ModelRunner`` (precision split), the swapped-lm_head log-prob forward (``--fused``: the fused kernel),
gradient checkpointing, a policy-gradient loss on the response tokens, backward, ``grads_to_master``, gradient
clipping and the AdamW step. Modes:

- ``lora``: the base in bf16 and frozen, fp32 adapters (``--rank``, all linear layers) and their AdamW states;
  also measured: a reference forward with the adapter off, and what a separate bf16 reference copy would add.
- ``full_bf16``: full fine-tuning with bf16 weights and bf16 AdamW states (``fsdp_config.model_dtype=bf16``).
- ``full``: full fine-tuning with the default recipe: fp32 master weights + bf16 compute copy + fp32 AdamW states.

Needs no hydra/omegaconf (runs on a bare image with torch, transformers and peft). The first step of each mode is a
warm-up; the others are timed. An out-of-memory error is recorded, not raised.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from types import SimpleNamespace

import torch

from npu_rl.config.engine_schema import FSDPConfig, MixedPrecisionConfig
from npu_rl.device import get_backend
from npu_rl.models.forward import LogprobOptions, response_logprobs
from npu_rl.models.lora import LoraSpec, adapter_disabled, apply_lora
from npu_rl.models.synthetic import SHAPES
from npu_rl.parallel.fsdp import clip_grad_norm
from npu_rl.workers.engine import build_optimizer
from npu_rl.workers.model_runner import ModelRunner


def _fsdp_config(model_dtype: str, param_dtype: str = "bf16"):
    return FSDPConfig(model_dtype=model_dtype, mixed_precision=MixedPrecisionConfig(param_dtype=param_dtype,
                                                                                     reduce_dtype="fp32"))


def _build(shape: str, dtype: torch.dtype, device: torch.device, checkpointing: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM


    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=32768, rope_theta=1e6)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    return model


def _batch(args, vocab: int, device: torch.device):
    g = torch.Generator().manual_seed(0)
    total = args.prompt_length + args.response_length
    ids = torch.randint(0, vocab, (args.rows, total), generator=g).to(device)
    mask = torch.ones_like(ids)
    pos = torch.arange(total, device=device).expand(args.rows, -1)
    adv = torch.randn(args.rows, args.response_length, generator=g).to(device)
    return ids, mask, pos, ids[:, args.prompt_length:], adv


def run_mode(mode: str, args) -> dict:
    backend = get_backend()
    device = backend.device()
    on_device = backend.is_accelerator  # memory figures come from the device layer's module
    result: dict = {"mode": mode}
    objects: dict = {}
    gc.collect()
    if on_device:  # what the previous mode left is freed now that its frame is gone
        backend.module.empty_cache()
    try:
        if on_device:
            backend.module.reset_peak_memory_stats()
        start = time.perf_counter()
        if mode == "lora":
            model = _build(args.shape, torch.bfloat16, device, args.checkpointing)
            model = apply_lora(model, LoraSpec(rank=args.rank, alpha=2 * args.rank), seed=0)
            fsdp = _fsdp_config("bf16")
        elif mode == "full_bf16":
            model = _build(args.shape, torch.bfloat16, device, args.checkpointing)
            fsdp = _fsdp_config("bf16")
        elif mode == "full":
            model = _build(args.shape, torch.float32, device, args.checkpointing)
            fsdp = _fsdp_config("fp32")
        else:
            raise ValueError(f"unknown mode {mode!r}")
        objects["runner"] = runner = ModelRunner(model, fsdp, trainable=True)
        objects["optimizer"] = optimizer = build_optimizer(runner.model, SimpleNamespace(
            lr=1e-5, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01))
        result["setup_s"] = time.perf_counter() - start
        result["params_total_b"] = sum(p.numel() for p in runner.model.parameters()) / 1e9
        result["params_trainable_m"] = sum(p.numel() for p in runner.model.parameters() if p.requires_grad) / 1e6
        ids, mask, pos, responses, adv = _batch(args, runner.model.config.vocab_size, device)
        options = LogprobOptions(use_fused_kernels=args.fused, fused_backend="auto" if args.fused else "torch")
        times = []
        for step in range(args.steps + 1):
            backend.synchronize()
            t0 = time.perf_counter()
            runner.train()
            logprobs, _ = response_logprobs(runner.compute_model, ids, mask, pos, responses, 1.0, options)
            loss = -(logprobs * adv).mean()
            loss.backward()
            runner.grads_to_master()
            clip_grad_norm(runner.model, 1.0)
            runner.optimizer_step(optimizer)
            optimizer.zero_grad(set_to_none=True)
            backend.synchronize()
            if step > 0:
                times.append(time.perf_counter() - t0)
        result["step_s"] = sum(times) / len(times)
        result["tokens_per_s"] = args.rows * (args.prompt_length + args.response_length) / result["step_s"]
        if on_device:
            result["peak_gib"] = backend.module.max_memory_allocated() / 2**30
            result["resident_gib"] = backend.module.memory_allocated() / 2**30
        if mode == "lora":  # the reference: the same weights with the adapter off, vs a second bf16 copy
            with torch.no_grad(), adapter_disabled(runner.model):
                backend.synchronize()
                t0 = time.perf_counter()
                response_logprobs(runner.compute_model, ids, mask, pos, responses, 1.0, options)
                backend.synchronize()
                result["ref_forward_s"] = time.perf_counter() - t0
            if on_device:
                before = backend.module.memory_allocated()
                copy = _build(args.shape, torch.bfloat16, device, False).requires_grad_(False)
                result["separate_ref_copy_gib"] = (backend.module.memory_allocated() - before) / 2**30
                del copy
    except torch.OutOfMemoryError as exc:
        result["error"] = "out of memory: " + str(exc).split("\n")[0][:300]
        if on_device:
            result["peak_gib"] = backend.module.max_memory_allocated() / 2**30
    finally:
        objects.clear()
        model = None
        gc.collect()
        if on_device:
            backend.module.empty_cache()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m npu_rl.commands.bench_lora", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen2.5-7b")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt-length", type=int, default=256)
    p.add_argument("--response-length", type=int, default=768)
    p.add_argument("--rank", type=int, default=64)
    p.add_argument("--steps", type=int, default=2, help="timed steps after one warm-up")
    p.add_argument("--modes", default="lora,full_bf16,full")
    p.add_argument("--fused", action="store_true", help="fused log-prob kernel (impl_backend=auto)")
    p.add_argument("--no-checkpointing", dest="checkpointing", action="store_false")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    results = []
    for mode in args.modes.split(","):
        results.append(run_mode(mode, args))
        print(json.dumps(results[-1]), flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
