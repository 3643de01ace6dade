"""Where ``npu-rl train`` spends its start-up: runs it with every start-up phase stamped (seconds since the
interpreter started), then prints the phases in one line each.

    python scripts/startup_stamps.py trainer.default_local_dir=$(mktemp -d)/run trainer.total_training_steps=1 \\
        trainer.test_freq=-1 trainer.save_freq=-1          # the embedded default, to the end of its first step
    python scripts/startup_stamps.py --convert             # the embedded model's GGUF conversion, parsed once
                                                           # and as transformers parses it, into fresh folders

The stamps wrap the trainer's own functions (config, tokenizer, data, the actor, the vLLM engine's constructor and
its imports, validation, steps, checkpoint, curves); nothing in the run changes. ``STAMP`` lines go to stderr as they
happen; the summary to stdout at the end. Used for docs/benchmarks.md, "Start-up".
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import time

import psutil

T0 = psutil.Process().create_time()  # the interpreter's start, not this module's
EVENTS: list[tuple[float, str]] = []


def stamp(label: str) -> None:
    EVENTS.append((time.time() - T0, label))
    print(f"STAMP {EVENTS[-1][0]:7.2f} {label}", file=sys.stderr, flush=True)


stamp("stamps imported")
import npu_rl.trainer.run as run  # noqa: E402  (after the first stamp: these imports are a phase)
from npu_rl.trainer import main_ppo, ppo_trainer  # noqa: E402
from npu_rl.models import loader  # noqa: E402
from npu_rl.rollout import vllm_engine  # noqa: E402
from npu_rl.workers import actor, actor_rollout  # noqa: E402

stamp("imported npu_rl.trainer.main_ppo")


def wrap(owner, name: str, label: str) -> None:
    fn = getattr(owner, name, None)
    if fn is None:
        return

    @functools.wraps(fn)
    def stamped(*args, **kwargs):
        stamp(f"> {label}")
        try:
            return fn(*args, **kwargs)
        finally:
            stamp(f"< {label}")

    setattr(owner, name, stamped)


def vllm_imports_stamped() -> None:
    real = vllm_engine.VllmRolloutEngine.__init__

    @functools.wraps(real)
    def init(self, *args, **kwargs):
        stamp("> vllm engine")
        from vllm import LLM  # noqa: F401  (imported here only to time it; the engine imports it again, for free)

        stamp("  vllm imported")
        try:
            return real(self, *args, **kwargs)
        finally:
            stamp("< vllm engine")

    vllm_engine.VllmRolloutEngine.__init__ = init


PHASES = [("config", ("load_checked", "notes")), ("tokenizer", ("tokenizer", "actor tokenizer")),
          ("data", ("dataloader",)), ("actor", ("actor",)), ("validation", ("validate",)),
          ("first step", ("step",)), ("checkpoint", ("checkpoint",)), ("curves", ("curves",))]


def summary() -> str:
    def total(label: str, first_only: bool = False) -> float:
        starts = [t for t, e in EVENTS if e == f"> {label}"]
        ends = [t for t, e in EVENTS if e == f"< {label}"]
        pairs = list(zip(starts, ends))[:1] if first_only else list(zip(starts, ends))
        return sum(b - a for a, b in pairs)

    at = {e: t for t, e in reversed(EVENTS)}  # the first time of each event
    parts = [f"imports {at.get('imported npu_rl.trainer.main_ppo', float('nan')):.1f}"]
    for name, labels in PHASES:
        parts.append(f"{name} {sum(total(label, first_only=name == 'first step') for label in labels):.2f}")
    if "> vllm engine" in at:
        imported = at["  vllm imported"] - at["> vllm engine"]
        parts += [f"vllm import {imported:.1f}", f"vllm engine {total('vllm engine') - imported:.1f}"]
    parts.append(f"first step starts at {at.get('> step', float('nan')):.1f}")
    return "startup: " + ", ".join(parts)


def convert_both() -> None:
    """The embedded model converted twice into fresh folders: parsed once (what npu-rl does), then as transformers
    parses it (a reader per object)."""
    for name, convert in (("parsed once", loader._convert_gguf_locked), ("as transformers", loader._convert_gguf_parsed)):
        out = os.path.join(tempfile.mkdtemp(prefix="npu-rl-convert-"), "smollm2-135m-instruct")
        start = time.perf_counter()
        convert("smollm2-135m-instruct", out)
        print(f"conversion, {name}: {time.perf_counter() - start:.1f} s -> {out}", flush=True)


def main(argv: list[str]) -> int:
    if argv == ["--convert"]:
        convert_both()
        return 0
    for owner, name, label in [(main_ppo, "load_checked", "load_checked"), (main_ppo, "_notes", "notes"),
                               (run, "load_tokenizer", "tokenizer"), (run, "build_dataloader", "dataloader"),
                               (actor.ActorWorker, "init_model", "actor"),
                               (actor_rollout, "load_tokenizer", "actor tokenizer"),
                               (ppo_trainer.PPOTrainer, "_validate", "validate"),
                               (ppo_trainer.PPOTrainer, "train_step", "step"),
                               (ppo_trainer.PPOTrainer, "save_checkpoint", "checkpoint"),
                               (run, "_draw_curves", "curves")]:
        wrap(owner, name, label)
    vllm_imports_stamped()
    code = main_ppo.main(argv, default_config="quickstart")
    stamp("done")
    print(summary(), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
