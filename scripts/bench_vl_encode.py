"""A Qwen-VL actor's log-prob pass and update, with each prompt's images encoded once per pass (what the engine
does) against the plain path (every row of every micro-batch runs the vision tower), and the hf rollout's generate
with each prompt's images encoded once against every sample's: wall time and vision-tower calls (patches for the
rollout) of each, on this machine's device, a tiny random model from npu_rl.models.synthetic.

    python scripts/bench_vl_encode.py [--kind qwen2_5_vl] [--prompts 4] [--n 8] [--micro 4] [--image 224]

The update is measured with ``actor.freeze_vision_tower=True`` (with a trained tower the update needs the tower's
gradient and always runs it per micro-batch). The fastest of ``--repeats`` rounds after a warm-up round (the
two paths alternate within a round, so a busy machine slows both alike); the log-probs of both paths
must agree (1e-5 relative). The numbers say how much of a pass the repeated vision forwards cost at this model's
proportions only, not at a real model's.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

from npu_rl.config.loader import load_config
from npu_rl.data.builtin import resolve_builtin
from npu_rl.data.dataset import PromptDataset
from npu_rl.data.loader import PromptCollator
from npu_rl.models.loader import load_causal_lm, load_tokenizer
from npu_rl.models.synthetic import save_random_vl_model
from npu_rl.models.vision import load_vision_inputs, vision_tower
from npu_rl.protocol import Batch
from npu_rl.rollout import SamplingParams
from npu_rl.rollout.hf import HFRolloutEngine
from npu_rl.rollout.utils import assemble_rollout_batch
from npu_rl.trainer.preflight import run_settings_for
from npu_rl.workers.actor import ActorWorker
from npu_rl.workers.model_runner import MicroBatching


def _prompts(folder: str, prompts: int, image: int) -> Batch:
    vision, tokenizer = load_vision_inputs(folder), load_tokenizer(folder)
    data = PromptDataset(resolve_builtin(f"builtin://shapes/train?num_train={prompts}&num_test=1&size={image}"),
                         tokenizer, vision=vision, max_prompt_length=4096)
    return PromptCollator(tokenizer.pad_token_id, vision)([data[i] for i in range(prompts)])


def _rollout(folder: str, prompts: Batch, n: int, response: int, repeats: int) -> dict:
    """The hf rollout's generate (n sampled rows a prompt, ``response`` tokens, no early stop), each prompt's images
    encoded once against every sample's: the fastest of ``repeats`` rounds after a warm-up, and the patches the
    vision tower took (a pre-hook)."""
    engine = HFRolloutEngine(load_causal_lm(folder), load_tokenizer(folder).pad_token_id)
    sampling = SamplingParams(n=n, temperature=1.0, max_new_tokens=response, stop_token_ids=[], return_logprobs=True)
    patches: list[int] = []
    vision_tower(engine.module).register_forward_pre_hook(lambda _, inputs: patches.append(inputs[0].shape[0]))
    times: dict[bool, list[float]] = {True: [], False: []}
    seen: dict[bool, list[int]] = {}
    for round_ in range(repeats + 1):
        for once in (True, False):
            engine.encode_images_once = once
            patches.clear()
            start = time.perf_counter()
            engine.generate(prompts, sampling)
            if round_:
                times[once].append(time.perf_counter() - start)
            seen[once] = list(patches)
    return {("once" if once else "per sample"): {"generate_s": round(min(times[once]), 4),
                                                  "vision_patches": sum(seen[once])} for once in (True, False)}


def _batch(folder: str, prompts: int, n: int, image: int, response: int) -> Batch:
    batch = _prompts(folder, prompts, image)
    tokenizer = load_tokenizer(folder)
    g = torch.Generator().manual_seed(0)
    responses = torch.randint(3, 100, (prompts * n, response), generator=g)
    out = assemble_rollout_batch(batch, responses, torch.ones_like(responses), n, tokenizer.pad_token_id)
    return out.union(Batch({"advantages": torch.randn(prompts * n, response, generator=g)}))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kind", default="qwen2_5_vl", choices=["qwen2_5_vl", "qwen3_vl"])
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--micro", type=int, default=4, help="rows per micro-batch (log-prob pass and update)")
    p.add_argument("--image", type=int, default=224, help="pixels per side of the task's pictures")
    p.add_argument("--response", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_random_vl_model(f"{tmp}/vl", args.kind, max_pixels=args.image * args.image)
        batch = _batch(folder, args.prompts, args.n, args.image, args.response)
        shapes = f"builtin://shapes/train?num_train={args.prompts}&num_test=1&size={args.image}"
        config = load_config([
            f"data.train_files='{shapes}'", f"data.val_files='{shapes}'", f"actor_rollout_ref.model.path={folder}",
            f"trainer.default_local_dir={tmp}/run", "trainer.n_gpus_per_node=1", "trainer.logger=[console]",
            "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.model.enable_gradient_checkpointing=False",
            "actor_rollout_ref.actor.use_torch_compile=False",
            "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32", "preset=grpo", f"data.max_response_length={args.response}", "data.max_prompt_length=4096",
            f"actor_rollout_ref.rollout.n={args.n}", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro}",
            f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.micro}",
            "actor_rollout_ref.actor.freeze_vision_tower=True", "actor_rollout_ref.actor.optim.lr=0",
            "actor_rollout_ref.actor.use_kl_loss=False"])
        arr = config.actor_rollout_ref
        worker = ActorWorker(arr.model, arr.actor, MicroBatching(args.micro, False, 0), run_settings_for(config))
        worker.init_model(total_training_steps=10 * args.repeats)
        calls = [0]
        vision_tower(worker.engine.compute_model).register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        times = {once: {"logprobs": [], "update": []} for once in (True, False)}
        counts, logprobs = {}, {}
        for round_ in range(args.repeats + 1):  # round 0 warms up; the modes alternate within each round
            for once in (True, False):
                worker.engine.encode_images_once = once
                calls[0] = 0
                start = time.perf_counter()
                out = worker.compute_logprobs(batch)
                seconds = time.perf_counter() - start
                logprob_calls = calls[0]
                start = time.perf_counter()
                worker.update_policy(batch.union(Batch({"old_logprobs": out["old_logprobs"]})))
                if round_:
                    times[once]["logprobs"].append(seconds)
                    times[once]["update"].append(time.perf_counter() - start)
                logprobs[once] = out["old_logprobs"]
                counts[once] = (logprob_calls, calls[0] - logprob_calls)
        results = {("once" if once else "per row"): {
            "logprobs_s": round(min(times[once]["logprobs"]), 4), "update_s": round(min(times[once]["update"]), 4),
            "vision_calls_logprobs": counts[once][0], "vision_calls_update": counts[once][1]} for once in (True, False)}
        torch.testing.assert_close(logprobs[True], logprobs[False], rtol=1e-5, atol=1e-6)
        rollout = _rollout(folder, _prompts(folder, args.prompts, args.image), args.n, args.response, args.repeats)
        image_tokens = int((batch["input_ids"][0] == load_vision_inputs(folder).image_token_id).sum())
        print(json.dumps({"kind": args.kind, "rows": len(batch), "prompts": args.prompts, "n": args.n,
                          "micro": args.micro, "image_tokens_per_prompt": image_tokens,
                          "sequence": int(batch["input_ids"].shape[1]), "threads": torch.get_num_threads(),
                          **results,
                          "speedup_logprobs": round(results["per row"]["logprobs_s"] / results["once"]["logprobs_s"], 2),
                          "speedup_update": round(results["per row"]["update_s"] / results["once"]["update_s"], 2),
                          "rollout": rollout, "speedup_rollout": round(rollout["per sample"]["generate_s"]
                                                                       / rollout["once"]["generate_s"], 2)}))


if __name__ == "__main__":
    main()
