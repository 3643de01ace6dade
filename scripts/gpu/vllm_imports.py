"""Which of vLLM's requirements does its in-process ``LLM`` engine import? Run on a machine without the GPU image.

    python scripts/gpu/vllm_imports.py TARGET_DIR [MODULE ...]

MODULEs, where given, replace the engine's list: e.g. verl's trainer and vLLM server modules (VERL_MODULES below,
``--verl``) with verl_wheels.txt's wheels in TARGET_DIR too.

TARGET_DIR holds vllm (and the wheels found so far) installed with ``pip install --no-deps --target``. Every top-level
module outside the standard library, TARGET_DIR and the GPU image's packages (scripts/gpu/image_packages.txt) is
refused, as it would be on the H200, so an import that needs a package the image lacks fails here too. The script
imports the modules the engine loads on a CUDA device (engine core, GPU worker and model runner, the attention
backends, the compiler, LoRA, the model files of the architectures we run) and prints, one a line, each missing
top-level module with the module that asked for it. Add the wheel that provides it to scripts/gpu/vllm_wheels.txt and
run again until it prints nothing. Modules that fail for another reason (a CUDA-only extension on this CPU machine)
are listed as "other" and are no sign of a missing wheel.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.metadata
import os
import sys
import traceback

ENGINE_MODULES = [
    "vllm", "vllm.entrypoints.llm", "vllm.v1.engine.llm_engine", "vllm.v1.engine.core", "vllm.v1.engine.core_client",
    "vllm.v1.executor.uniproc_executor", "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.attention.backends.flash_attn", "vllm.v1.attention.backends.triton_attn",
    "vllm.v1.sample.sampler", "vllm.v1.sample.logits_processor", "vllm.v1.structured_output",
    "vllm.v1.core.sched.scheduler", "vllm.v1.core.kv_cache_manager",
    "vllm.compilation.backends", "vllm.compilation.cuda_graph", "vllm.compilation.wrapper", "vllm.compilation.decorators",
    "vllm.device_allocator.cumem", "vllm.distributed.parallel_state",
    "vllm.model_executor.model_loader", "vllm.model_executor.model_loader.default_loader",
    "vllm.model_executor.model_loader.dummy_loader", "vllm.model_executor.models.registry",
    "vllm.model_executor.models.llama", "vllm.model_executor.models.qwen2", "vllm.model_executor.models.qwen3",
    "vllm.model_executor.layers.layernorm", "vllm.model_executor.layers.activation",
    "vllm.model_executor.layers.linear", "vllm.model_executor.layers.rotary_embedding",
    "vllm.model_executor.layers.vocab_parallel_embedding", "vllm.model_executor.layers.logits_processor",
    "vllm.lora.request", "vllm.lora.peft_helper", "vllm.lora.worker_manager", "vllm.lora.model_manager",
    "vllm.lora.layers", "vllm.lora.punica_wrapper.punica_gpu",
    "vllm.tokenizers", "vllm.transformers_utils.config", "vllm.transformers_utils.tokenizer",
    "vllm.multimodal", "vllm.inputs", "vllm.outputs", "vllm.sampling_params", "vllm.config",
    "vllm.utils.torch_utils", "vllm._custom_ops", "vllm.vllm_flash_attn",
]


def _names(path: str) -> set[str]:
    with open(path) as fh:
        words = [line.split("#")[0].strip() for line in fh.read().replace(" ", "\n").splitlines()]
    return {w.split("==")[0].lower().replace("_", "-") for w in words if w}


def _allowed_top_levels(target: str, here: str) -> set[str]:
    """Top-level modules the H200 would find: the image's packages (this machine's copies) and the target dir (the
    wheels carried so far)."""
    image = _names(os.path.join(here, "image_packages.txt"))
    # jaraco, more_itertools, platformdirs, backports: vendored by setuptools (pkg_resources), which the image has
    allowed = set(sys.stdlib_module_names) | {"_distutils_hack", "npu_rl", 
                                                      "jaraco", "more_itertools", "platformdirs", "backports"}
    for top, dists in importlib.metadata.packages_distributions().items():
        if any(d.lower().replace("_", "-") in image for d in dists):
            allowed.add(top)
    for entry in os.listdir(target):
        allowed.add(entry.removesuffix(".py").split(".")[0])
    return allowed


class _OnlyImage(importlib.abc.MetaPathFinder):
    """Wraps a finder of sys.meta_path: it finds only modules the GPU image (or the target dir) would hold, so that a
    module installed here but absent there reads as not installed, to ``import`` and ``find_spec`` alike."""

    def __init__(self, inner, allowed: set[str]):
        self.inner, self.allowed = inner, allowed

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in self.allowed or top.startswith("_"):
            return self.inner.find_spec(name, path, target)
        return None

    def find_distributions(self, *args, **kwargs):
        return getattr(self.inner, "find_distributions", lambda *a, **k: iter(()))(*args, **kwargs)

    def invalidate_caches(self):
        if hasattr(self.inner, "invalidate_caches"):
            self.inner.invalidate_caches()


# what verl's main_ppo loads on its way to a step: the v1 trainer, the FSDP engine workers, the agent loop and the
# vLLM HTTP server it starts (vLLM's OpenAI API server: more of vLLM than the in-process engine imports)
VERL_MODULES = [
    "verl.trainer.main_ppo", "verl.trainer.ppo.v1", "transfer_queue", "verl.workers.engine_workers",
    "verl.workers.engine.fsdp.transformer_impl", "verl.experimental.agent_loop",
    "verl.experimental.agent_loop.single_turn_agent_loop", "verl.workers.rollout.vllm_rollout.vllm_async_server",
    "vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.serve", "verl.experimental.reward_loop",
    "verl.checkpoint_engine", "verl.utils.tracking",
]


def main(target: str, modules: list[str] | None = None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    # this machine's huggingface_hub 2.x needs httpx2 / httpcore2 / truststore, the image's 1.x does not: import it
    # (and transformers) before the filter, so that only what vLLM itself imports is checked
    import huggingface_hub.hf_api  # noqa: F401
    import transformers  # noqa: F401

    sys.path.insert(0, target)
    allowed = _allowed_top_levels(target, here)
    sys.meta_path[:] = [f if getattr(f, "__name__", "") in ("BuiltinImporter", "FrozenImporter")
                        else _OnlyImage(f, allowed) for f in sys.meta_path]
    missing: dict[str, str] = {}
    other: dict[str, str] = {}
    for module in modules or ENGINE_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name and not err.name.startswith(("vllm", "verl")):
                missing.setdefault(err.name.partition(".")[0], module)
            else:
                other[module] = f"{type(err).__name__}: {err}"
        except Exception as err:  # a CUDA-only extension, a device check: not a missing wheel
            other[module] = f"{type(err).__name__}: {err}".splitlines()[0]
            if os.environ.get("VLLM_IMPORTS_TRACE"):
                traceback.print_exc()
    for name, module in sorted(missing.items()):
        print(f"missing {name}  (importing {module})")
    for module, why in other.items():
        print(f"other {module}: {why[:300]}")
    return 1 if missing else 0


if __name__ == "__main__":
    extra = sys.argv[2:]
    sys.exit(main(sys.argv[1], VERL_MODULES if extra == ["--verl"] else extra))
