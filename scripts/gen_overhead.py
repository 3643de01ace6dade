"""HF generation on the same weights three ways, to isolate what FSDP2 costs the rollout:

- ``plain``: the model as loaded (bf16);
- ``fsdp hooks``: the model under ``fully_shard`` (world size 1: no communication at all), generating on the
  sharded module (``gather_full_weights=False``): FSDP2's pre/post-forward hooks run in every layer at every token;
- ``gathered + twin``: the same FSDP2 module, gathered once (``unsharded``) and decoded on the hook-free twin
  (``PlainView``), which is what the hf rollout does now.

    python scripts/gen_overhead.py [--shape qwen2.5-0.5b] [--rows 32] [--prompt-length 128] [--new-tokens 256]

Greedy, no stop token (every row decodes ``--new-tokens``); median of 3 after a warm-up; tokens must agree.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="qwen2.5-0.5b")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--prompt-length", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--engines", default="plain,fsdp hooks,gathered + twin", help="comma list of the three")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (host threads) first")
    p.add_argument("--compiled", action="store_true", help="compiled decoding (static cache + torch.compile) where "
                   "the engine allows it (not on the FSDP-hooks module)")
    p.add_argument("--generate-kwargs", default="{}", help="JSON: extra transformers generation settings "
                   "(what rollout.engine_kwargs.hf passes), e.g. '{\"cache_implementation\": \"static\"}'")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from npu_rl.device import get_backend
    from npu_rl.models.synthetic import random_causal_lm
    from npu_rl.parallel import FSDPSettings, apply_fsdp2, build_mesh
    from npu_rl.parallel.mesh import init_distributed
    from npu_rl.protocol import Batch
    from npu_rl.rollout import SamplingParams
    from npu_rl.rollout.hf import HFRolloutEngine

    backend = get_backend()
    init_distributed()
    device = backend.device()
    model = random_causal_lm(args.shape, 0, torch.float32).to(device)
    plain = copy.deepcopy(model).to(torch.bfloat16)
    sharded = apply_fsdp2(model, build_mesh(), FSDPSettings(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    ids = torch.randint(3, 100, (args.rows, args.prompt_length), generator=torch.Generator().manual_seed(0))
    prompts = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                    {"uid": [str(i) for i in range(args.rows)]}, {})
    sampling = SamplingParams(n=1, do_sample=False, max_new_tokens=args.new_tokens, stop_token_ids=[],
                              return_logprobs=True)
    extra = json.loads(args.generate_kwargs)
    common = dict(generate_kwargs=extra, compiled_decode=args.compiled)
    engines = {"plain": HFRolloutEngine(plain, 0, **common),
               "fsdp hooks": HFRolloutEngine(sharded, 0, gather_full_weights=False, **common),
               "gathered + twin": HFRolloutEngine(sharded, 0, **common)}
    engines = {name: engines[name] for name in args.engines.split(",")}
    results, tokens, last_metrics = {}, {}, {}
    for name, engine in engines.items():
        start = time.perf_counter()
        engine.generate(prompts, sampling)  # warm-up
        print(f"{name}: warm-up generate {time.perf_counter() - start:.1f} s", flush=True)
        times = []
        for _ in range(args.repeats):
            backend.synchronize()
            start = time.perf_counter()
            generated = engine.generate(prompts, sampling)
            out, last_metrics[name] = generated.batch, generated.metrics
            backend.synchronize()
            times.append(time.perf_counter() - start)
        results[name] = sorted(times)[len(times) // 2]
        tokens[name] = out["responses"].cpu()
    print(f"{args.shape}, {args.rows} rows x {args.prompt_length} prompt + {args.new_tokens} new tokens, greedy, "
          f"{backend.device_name()}, torch {torch.__version__}, {torch.get_num_threads()} host threads")
    print("| module | generate s | ms per decoded token | tokens equal plain |")
    print("|---|---|---|---|")
    for name, seconds in results.items():
        same = bool(torch.equal(tokens[name], tokens["plain"])) if "plain" in tokens else "-"
        print(f"| {name} | {seconds:.2f} | {1e3 * seconds / args.new_tokens:.1f} | {same} |")
    for name in engines:
        print(f"{name}: {last_metrics[name]}")


if __name__ == "__main__":
    main()
