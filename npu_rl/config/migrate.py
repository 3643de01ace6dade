"""``npu-rl migrate SCRIPT.sh`` (or ``--overrides k=v ...`` / ``--overrides-file FILE``): what each of a verl run
script's overrides becomes in npu-rl, and the equivalent npu-rl command.

For every override it prints one line: ``supported`` (our key, same meaning), ``mapped`` (verl's name for one of
our keys: the new name), ``no effect`` (accepted and dropped: why), ``refused`` (a feature npu-rl lacks: why, and
what to use instead), ``unknown`` (not a key of verl's tree either: the closest key). Settings that behave
differently on Ascend NPUs are flagged (``ascend``; see docs/npu.md). Then it writes the npu-rl command: supported
and mapped overrides as they should be written, dropped ones left out, refused ones commented out.

The script is read statically (:mod:`npu_rl.config.shell_args`), never run. Exit status: 0 when every override is
accepted, 1 when one is refused or unknown, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import dataclass

from npu_rl.config import verl_keys

# key (or subtree) -> how it behaves differently on Ascend NPUs (docs/npu.md); flagged when the script sets it
ASCEND_NOTES: dict[str, str] = {
    "actor_rollout_ref.rollout.name": "vllm means vLLM-Ascend on an NPU (same offline engine, ACL graphs); sglang "
                                      "is not supported",
    "actor_rollout_ref.rollout.enforce_eager": "False captures ACL graphs (FULL_DECODE_ONLY) instead of CUDA graphs",
    "actor_rollout_ref.rollout.free_cache_engine": "sleep mode on vLLM-Ascend needs NZ weights off (npu-rl passes "
                                                   "additional_config weight_nz_mode=0)",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "the fraction of NPU memory vLLM-Ascend takes",
    "actor_rollout_ref.rollout.calculate_log_probs": "vLLM-Ascend's sampler ignores logprobs_mode: raw log-probs",
    "actor_rollout_ref.model.use_fused_kernels": "the Triton kernels were never compiled by triton-ascend; "
                                                 "NPU_RL_KERNEL_BACKEND=torch selects the chunked torch path",
    "actor_rollout_ref.model.use_remove_padding": "packed attention runs through npu_fusion_attention (TND layout); "
                                                  "not verified on NPU hardware",
    "actor_rollout_ref.model.attn_implementation": "flash_attention_2 is served by npu_fusion_attention on Ascend",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "all-to-all over HCCL; run on gloo only so far",
    "actor_rollout_ref.actor.fsdp_config.param_offload": "offload goes to host memory over the NPU's PCIe link",
    "trainer.device": "auto picks the NPU when torch_npu sees a device; the GPU setting fails on an Ascend host",
    "ray_kwargs.ray_init.runtime_env": "workers need the CANN environment (scripts/runtime_env.yaml)",
}

KIND_LABELS = {"implemented": "supported", "alias": "mapped", "no_effect": "no effect", "refused": "refused",
               "being_built": "refused", "unknown": "unknown"}


@dataclass
class Row:
    override: str
    key: str
    kind: str  # implemented | alias | no_effect | refused | being_built | unknown | off
    detail: str = ""
    rewritten: str | None = None  # the override for the npu-rl command; None: left out
    ascend: str = ""


def _split(override: str) -> tuple[str, str, str | None]:
    """(prefix '+', '++' or '~', key, value text or None)."""
    body = override.lstrip("+~")
    prefix = override[: len(override) - len(body)]
    key, sep, value = body.partition("=")
    return prefix, key, (value if sep else None)


def _parse_value(text: str | None):
    if text is None:
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_overrides([f"k={text}"])[0].value()
    except HydraException:  # not a Hydra value: keep the text
        return text


def classify_override(override: str) -> Row:
    prefix, key, value_text = _split(override)
    if key in ("preset", "hydra") or key.startswith("hydra."):
        return Row(override, key, "implemented", rewritten=override)
    status = verl_keys.classify(key)
    ascend = next((note for k, note in ASCEND_NOTES.items() if key == k or key.startswith(k + ".")), "")
    row = Row(override, key, status.kind, ascend=ascend)
    if status.kind == "implemented":  # no '+' needed: the key exists, or lies in a free-form dict
        row.rewritten = override if prefix.startswith("~") else key + (
            f"={value_text}" if value_text is not None else "")
    elif status.kind == "alias":
        row.detail = f"-> {status.target}"
        row.rewritten = status.target + (f"={value_text}" if value_text is not None else "")
    elif status.kind == "no_effect":
        row.detail = status.why
    elif status.kind in ("refused", "being_built"):
        if verl_keys.is_off(key, _parse_value(value_text)):
            row.kind = "off"
            row.detail = f"accepted, the feature stays off ({status.why})"
        else:
            row.detail = f"{status.why}; instead: {status.instead}"
    else:
        from npu_rl.config.loader import suggest_key

        hint = suggest_key(key)
        row.detail = "not a key of verl's tree or npu-rl's" + (f"; did you mean {hint!r}?" if hint else "")
    return row


# verl's recipe.dapo.main_dapo is main_ppo with recipe/dapo/config/dapo_trainer.yaml: these defaults on top
DAPO_ENTRY_DEFAULTS = ("reward_model.reward_manager=dapo", "trainer.project_name=verl-dapo")


def dapo_entry_defaults(overrides: list[str]) -> tuple[list[str], str]:
    """The overrides with verl's DAPO entry point's own defaults put first (where the script does not set them)."""
    keys = {_split(o)[1] for o in overrides}
    added = [d for d in DAPO_ENTRY_DEFAULTS if d.split("=", 1)[0] not in keys]
    note = ("the script runs recipe.dapo.main_dapo, which is main_ppo plus the DAPO recipe's defaults; added: "
            + (", ".join(added) if added else "nothing (the script sets them)"))
    return added + list(overrides), note


def migrate(overrides: list[str]) -> list[Row]:
    return [classify_override(o) for o in overrides]


def render(rows: list[Row], source: str, warnings: list[str], config_name: str = "ppo_trainer") -> str:
    lines = [f"# npu-rl migrate: {source} ({len(rows)} overrides)"]
    lines += [f"# warning: {w}" for w in warnings]
    width = max((len(r.override) for r in rows), default=0)
    width = min(width, 72)
    for row in rows:
        label = "no effect" if row.kind == "off" else KIND_LABELS[row.kind]
        detail = f"  {row.detail}" if row.detail else ""
        lines.append(f"{label:<10} {row.override:<{width}}{detail}".rstrip())
        if row.ascend:
            lines.append(f"{'':<10} ascend: {row.ascend}")
    counts = {}
    for row in rows:
        label = "no effect" if row.kind == "off" else KIND_LABELS[row.kind]
        counts[label] = counts.get(label, 0) + 1
    lines.append("# " + ", ".join(f"{n} {label}" for label, n in counts.items()))
    lines.append("")
    lines.append("# the equivalent npu-rl command:")
    kept = [shlex.quote(row.rewritten) for row in rows if row.rewritten is not None]
    command = [f"python3 -m npu_rl.trainer.main_ppo --config-name {config_name}"] + [f"    {o}" for o in kept]
    command = [line + " \\" for line in command[:-1]] + command[-1:]
    for row in rows:
        if row.kind in ("refused", "being_built", "unknown"):
            command.append(f"#   {row.override}    # {KIND_LABELS[row.kind]}: {row.detail}")
    return "\n".join(lines + command)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="npu-rl migrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("script", nargs="?", help="a verl run script (.sh); read, never run")
    parser.add_argument("--overrides", nargs="+", metavar="KEY=VALUE", help="overrides instead of a script")
    parser.add_argument("--overrides-file", help="a file with one override per line (# comments allowed)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a shell variable for reading the script (e.g. DEVICE=npu, MODEL_PATH=...)")
    args = parser.parse_args(argv)
    sources = [bool(args.script), bool(args.overrides), bool(args.overrides_file)]
    if sum(sources) != 1:
        parser.print_usage(sys.stderr)
        print("npu-rl migrate: give exactly one of SCRIPT, --overrides or --overrides-file", file=sys.stderr)
        return 2
    warnings: list[str] = []
    if args.script:
        from npu_rl.config.shell_args import read_script

        # the variables the script would see: this shell's environment, then --env
        env = {**os.environ, **dict(e.split("=", 1) for e in args.env if "=" in e)}
        try:
            with open(args.script, encoding="utf-8") as f:
                reading = read_script(f.read(), env)
        except OSError as exc:
            print(f"npu-rl migrate: cannot read {args.script}: {exc}", file=sys.stderr)
            return 2
        overrides, warnings, source = reading.overrides, reading.warnings, args.script
        if reading.entry_point.endswith("main_dapo"):
            overrides, note = dapo_entry_defaults(overrides)
            warnings.append(note)
        if reading.entry_point is None:
            print(f"npu-rl migrate: {args.script}: no `python3 -m verl.trainer.main_ppo ...` command found",
                  file=sys.stderr)
            return 2
    elif args.overrides_file:
        with open(args.overrides_file, encoding="utf-8") as f:
            overrides = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
        source = args.overrides_file
    else:
        overrides, source = list(args.overrides), "overrides"
    rows = migrate(overrides)
    config_name = "ppo_trainer"
    print(render(rows, source, warnings, config_name))
    return 1 if any(r.kind in ("refused", "being_built", "unknown") for r in rows) else 0
