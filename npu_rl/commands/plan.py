"""``npu-rl plan [--device h200] [key=value ...]``: will this job fit? The per-device memory of each phase of one
step (rollout, log-probs, reference, critic, update), the peak, whether it fits the named device, the one or two
keys that would make it fit, and the host memory per node; for a mixture of experts also the total and active
parameters, the expert shards under ``--ep`` and the all-to-all buffers and routed activations; for a Qwen-VL model
its vision tower and the images assumed (``--images-per-prompt``, ``--image-size``, ``--vision-encode``); then a roofline
estimate of each phase's seconds, s/step and tokens/s per device (npu_rl/plan/timing.py; h200, h100, atlas-a2,
atlas-a3; responses at ``data.max_response_length`` unless ``--mean-response-length``). Nothing is loaded:
model shapes come from config.json (``--model-config FILE`` for a Hub id that is not on this machine). With no
``--config-name`` it plans what ``npu-rl train`` with the same arguments runs (the embedded default, quickstart); a verl
script's job is ``--config-name ppo_trainer key=value ...``. The arithmetic: npu_rl/plan/memory.py.

The config is checked first with training's own value checks (``--cfg job``'s, without the files and the device):
0 or a negative number of devices, lengths <= 0, a micro-batch of 0, a tensor-parallel size that does not divide the
devices are refused, naming the key, as ``npu-rl train`` refuses them, never planned as "fits"."""

from __future__ import annotations

import argparse
import sys

from npu_rl.compat.verl.translate import translate_overrides
from npu_rl.config.loader import ConfigError, load_config
from npu_rl.plan.job import plan_config, this_device
from npu_rl.plan.memory import DEVICES
from npu_rl.plan.vision import VISION_ENCODE_MODES
from npu_rl.trainer.preflight import check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="npu-rl plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help=f"{' | '.join(DEVICES)} (default: this machine's)")
    parser.add_argument("--model-config", default=None, help="the policy's config.json (a Hub id not on disk)")
    parser.add_argument("--critic-model-config", default=None, help="the critic's config.json")
    parser.add_argument("--ep", type=int, default=None, help="expert-parallel size of a mixture-of-experts actor: its "
                        "routed experts split over this many ranks (default: the config's "
                        "actor_rollout_ref.actor.fsdp_config.expert_parallel_size)")
    parser.add_argument("--mean-prompt-length", type=int, default=None, help="prompt tokens the time estimate "
                        "assumes (default: data.max_prompt_length)")
    parser.add_argument("--mean-response-length", type=int, default=None, help="mean response tokens the time "
                        "estimate assumes (default: data.max_response_length)")
    parser.add_argument("--images-per-prompt", type=int, default=None, help="a Qwen-VL actor: images in each prompt "
                        "(default 1)")
    parser.add_argument("--image-size", default=None, help="a Qwen-VL actor: the pictures' size in pixels, 448 or "
                        "WIDTHxHEIGHT, resized as the data set does (default: builtin://shapes' size, else max_pixels)")
    parser.add_argument("--vision-encode", choices=VISION_ENCODE_MODES, default=None, help="a Qwen-VL actor: "
                        "each prompt's images encoded once per pass where no gradient reaches the tower (transformers "
                        ">= 5.19), else each micro-batch's distinct prompts' images (once), or always those "
                        "(per-micro-batch: older transformers), or every row's (per-row: the code before the tower's "
                        "dedup, or NPU_RL_VISION_DEDUP=0; default: this machine's transformers and that switch)")
    parser.add_argument("--config-name", "-cn", default="quickstart",
                        help="the config to plan, as `npu-rl train` takes it (default: the embedded default, "
                        "quickstart, which `npu-rl train` runs; ppo_trainer is verl's)")
    parser.add_argument("--config-path", "-cp", default=None)
    parser.add_argument("overrides", nargs="*", help="key=value overrides (verl's keys)")
    args = parser.parse_args(argv)

    try:
        # verl's renamed keys (reward.custom_reward_function.*, ...) read as `npu-rl train` reads them
        config = load_config(translate_overrides(args.overrides), args.config_name, args.config_path)
        check(config, check_paths=False, check_device=False)  # training's value checks, before any arithmetic
        result = plan_config(config, args.device or this_device(), model_config=args.model_config,
                             critic_model_config=args.critic_model_config, ep=args.ep,
                             mean_prompt_length=args.mean_prompt_length,
                             mean_response_length=args.mean_response_length,
                             images_per_prompt=args.images_per_prompt, image_size=args.image_size,
                             vision_encode=args.vision_encode)
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"npu-rl plan: {exc}", file=sys.stderr)
        return 2
    print(result.table())
    print(result.verdict())
    if result.counter_note():
        print(result.counter_note())
    if result.time is not None:
        print(result.time.table())
        print(result.time.verdict())
    else:
        print(f"time plan: no roofline for {result.device.name} (h200, h100, atlas-a2, atlas-a3 have one)")
    return 0 if result.fits else 1
