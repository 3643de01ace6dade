"""``npu-rl doctor --parity MODEL``: how far apart are the rollout engine's and the actor's log-probs?

It builds the actor and the rollout engine exactly as training would (the embedded default config, then the user's
overrides: dtype, attention, fused kernels, remove-padding, the NPU patches the device layer applies), generates a
few responses with the configured engine (weights synced from the actor as in a training step), recomputes their
log-probs with the actor's forward, and prints

- the per-token gap ``|log p_actor - log p_rollout|``: mean, p99, max, and the tokens with the largest gaps (row,
  position, token);
- what each rollout correction would do to this batch (share of tokens / sequences truncated or rejected);
- on an NPU, the gap with each patch turned off in turn (RMSNorm, rotary, internal format), to show which one
  moves it (this path has never run on an NPU);
- a recommendation.

Sampling: with top-p < 1 or top-k > 0 the rollout's log-probs are those of the truncated distribution and the gap
includes the truncation (the report says so); the default (temperature 1, top-p 1, top-k -1) measures numerics only.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

import torch

from npu_rl.config.errors import ConfigError
from npu_rl.core.rollout_correction import RolloutCorrectionSpec, rollout_correction
from npu_rl.data.loader import build_dataloader
from npu_rl.device import get_backend
from npu_rl.device.patch_toggles import patch_variants
from npu_rl.models.check import check_model_folder
from npu_rl.trainer.preflight import load_checked, run_settings_for
from npu_rl.workers.actor_rollout import ActorRolloutWorker

# (label, settings) of the corrections whose effect the report shows.
CORRECTIONS: tuple[tuple[str, dict], ...] = (
    ("token TIS at 2.0 (rollout_is=token)", {"rollout_is": "token", "rollout_is_threshold": 2.0}),
    ("sequence TIS at 2.0 (rollout_is=sequence)", {"rollout_is": "sequence", "rollout_is_threshold": 2.0}),
    ("token MIS 0.5_2.0 (rollout_is_threshold='0.5_2.0')",
     {"rollout_is": "token", "rollout_is_threshold": "0.5_2.0"}),
    ("token rejection token_k1 at 2.0", {"rollout_rs": "token_k1", "rollout_rs_threshold": 2.0}),
    ("geometric-mean rejection seq_mean_k1 at 1.02", {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": 1.02}),
)
SMALL_P99, SMALL_MAX = 0.02, 0.2  # nats: below both, no correction is needed


@dataclass
class GapStats:
    tokens: int
    sequences: int
    mean_abs: float
    mean_signed: float  # actor - rollout
    p99: float
    max: float
    seq_max_abs_mean: float  # the largest |mean over a sequence of the log-ratio|
    largest: list[tuple[int, int, int, float, float]] = field(default_factory=list)  # row, pos, id, rollout, actor
    corrections: list[tuple[str, float, float]] = field(default_factory=list)  # label, token share, seq share


def gap_stats(actor: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor, responses: torch.Tensor,
              top: int = 5) -> GapStats:
    """Statistics of ``actor - rollout`` [B, T] over ``mask``; ``responses`` [B, T] gives the token ids."""
    actor, rollout, valid = actor.double(), rollout.double(), mask.bool()
    diff = actor - rollout
    gaps = diff.abs()[valid]
    if gaps.numel() == 0:
        raise ValueError("parity: the engine generated no response tokens (raise data.max_response_length?)")
    row_mean = (diff * valid).sum(-1) / valid.sum(-1).clamp(min=1)
    order = torch.argsort(torch.where(valid, diff.abs(), torch.full_like(diff, -1.0)).flatten(), descending=True)
    largest = []
    for flat in order[:min(top, gaps.numel())].tolist():
        row, pos = divmod(flat, diff.shape[1])
        largest.append((row, pos, int(responses[row, pos]), float(rollout[row, pos]), float(actor[row, pos])))
    stats = GapStats(tokens=int(gaps.numel()), sequences=int(valid.any(-1).sum()), mean_abs=float(gaps.mean()),
                     mean_signed=float(diff[valid].mean()), p99=float(torch.quantile(gaps, 0.99)),
                     max=float(gaps.max()), seq_max_abs_mean=float(row_mean[valid.any(-1)].abs().max()),
                     largest=largest)
    for label, settings in CORRECTIONS:
        out = rollout_correction(actor, rollout, mask.to(actor.dtype), RolloutCorrectionSpec(**settings))
        if out.weights is not None:  # truncated (TIS) or zeroed (MIS): the applied weight is not the raw ratio
            raw = torch.exp(_log_ratio_for(settings["rollout_is"], diff, valid))
            touched = ((out.weights - raw).abs() > 1e-9 * raw.clamp(min=1)) & valid
        else:  # rejected
            touched = valid & ~out.response_mask.bool()
        rows = valid.any(-1)
        token_share, seq_share = touched.sum() / valid.sum(), touched.any(-1)[rows].double().mean()
        stats.corrections.append((label, float(token_share), float(seq_share)))
    return stats


def _log_ratio_for(level: str, diff: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    if level == "token":
        return diff
    return (diff * valid).sum(-1, keepdim=True).expand_as(diff)


def recommend(stats: GapStats) -> str:
    if stats.p99 < SMALL_P99 and stats.max < SMALL_MAX:
        return (f"the gap is small (p99 {stats.p99:.3g} < {SMALL_P99}, max {stats.max:.3g} < {SMALL_MAX} nats): no "
                "correction needed; keep actor_rollout_ref.rollout.calculate_log_probs=true to watch "
                "rollout_corr/* during training")
    token_tis = stats.corrections[0][1]
    if token_tis < 0.01:
        return (f"the gap is real (p99 {stats.p99:.3g}, max {stats.max:.3g} nats) but no token ratio is far from 1 "
                f"({100 * token_tis:.2f}% above 2): use token-level TIS at 2.0 as a cheap safety net "
                "(algorithm.rollout_correction.rollout_is=token, rollout_is_threshold=2.0)")
    return (f"the gap is large ({100 * token_tis:.1f}% of token ratios above 2): use token-level TIS at 2.0 plus "
            "geometric-mean rejection (rollout_rs=seq_mean_k1, rollout_rs_threshold=1.02), and look for the cause "
            "first: rollout and actor dtype (rollout.dtype, fsdp_config.mixed_precision.param_dtype), a stale weight "
            "sync, or a kernel (below, on an NPU, each patch turned off in turn)")


def format_report(title: str, stats: GapStats, decode, variants: list[tuple[str, GapStats]], note: str) -> str:
    lines = [title, f"tokens {stats.tokens} in {stats.sequences} responses; {note}",
             (f"per-token gap |log p_actor - log p_rollout| (nats): mean {stats.mean_abs:.4g}  p99 {stats.p99:.4g}  "
             f"max {stats.max:.4g}  (signed mean {stats.mean_signed:+.3g}; largest |sequence mean| "
             f"{stats.seq_max_abs_mean:.3g})"), "largest gaps:"]
    for row, pos, token, rollout_lp, actor_lp in stats.largest:
        lines.append(f"  response {row:>3} position {pos:>4} token {token:>6} {decode(token)!r:<14} rollout "
                     f"{rollout_lp:+.4f}  actor {actor_lp:+.4f}  gap {actor_lp - rollout_lp:+.4f}")
    lines.append("what a correction would do to this batch (tokens / sequences affected):")
    for label, token, seq in stats.corrections:
        lines.append(f"  {label:<52} {100 * token:6.2f}% / {100 * seq:6.2f}%")
    for name, variant in variants:
        lines.append(f"  with the {name} patch off: mean {variant.mean_abs:.4g}  p99 {variant.p99:.4g}  max "
                     f"{variant.max:.4g}  ({variant.mean_abs - stats.mean_abs:+.3g} mean vs patched)")
    lines.append(f"recommendation: {recommend(stats)}")
    return "\n".join(lines)


def _note(config) -> str:
    rollout = config.actor_rollout_ref.rollout
    note = f"sampling temperature {rollout.temperature}, top_p {rollout.top_p}, top_k {rollout.top_k}"
    if rollout.top_p < 1 or rollout.top_k > 0:
        note += " (truncated: the rollout's log-probs are renormalised over the kept tokens, the gap includes that)"
    return note


def run_parity(model: str, overrides: list[str], num_prompts: int, top: int, config_name: str = "quickstart") -> str:
    """Build, generate, recompute; returns the report."""
    config = load_checked([f"actor_rollout_ref.model.path={model}", "trainer.n_gpus_per_node=1",
                          "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.n=1",
                          "actor_rollout_ref.rollout.calculate_log_probs=true", f"data.val_batch_size={num_prompts}",
                          f"data.train_batch_size={num_prompts}",
                          f"actor_rollout_ref.actor.ppo_mini_batch_size={num_prompts}",
                          f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={num_prompts}",
                          *overrides], config_name, check_paths=False)  # (the update's sizes only need to validate)
    backend = get_backend(None if config.trainer.device == "auto" else config.trainer.device)
    backend.manual_seed(config.trainer.seed)
    arr = config.actor_rollout_ref
    worker = ActorRolloutWorker(arr.model, arr.actor, arr.rollout, run_settings_for(config))
    worker.init_model(1)
    prompts = next(iter(build_dataloader(config.data, worker.tokenizer, "val"))).index(slice(0, num_prompts))
    batch = worker.generate_sequences(prompts).batch

    def actor_logprobs():
        return worker.compute_logprobs(batch)["old_logprobs"]

    args = (batch["rollout_logprobs"], batch["response_mask"], batch["responses"], top)
    stats = gap_stats(actor_logprobs(), *args)
    variants = []
    for name, undo in patch_variants(backend.name):
        with undo():
            variants.append((name, gap_stats(actor_logprobs(), *args)))
    title = (f"npu-rl doctor --parity {model}: engine {arr.rollout.name} ({type(worker.engine).__name__}, dtype "
             f"{arr.rollout.dtype}) vs actor (param_dtype {arr.actor.fsdp_config.mixed_precision.param_dtype}, "
             f"attention {arr.model.attn_implementation}, fused kernels {arr.model.use_fused_kernels}, remove padding {arr.model.use_remove_padding}) on "
             f"{backend.name}")
    return format_report(title, stats, lambda t: worker.tokenizer.decode([t]), variants, _note(config))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="npu-rl doctor --parity", description=__doc__.split("\n")[0])
    parser.add_argument("--parity", metavar="MODEL", required=True,
                        help="an HF folder or a built-in name (e.g. smollm2-135m-instruct, the embedded default's)")
    parser.add_argument("--prompts", type=int, default=8, help="how many prompts (data.val_files of the config)")
    parser.add_argument("--top", type=int, default=8, help="how many of the largest gaps to list")
    parser.add_argument("--config-name", default="quickstart", help="the config to start from (default: the "
                        "embedded default, quickstart)")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. actor_rollout_ref.rollout.name=hf")
    if any(a in ("-h", "--help") for a in argv):  # `--parity --help` would read --help as the model
        parser.print_help()
        return 0
    args = parser.parse_args(argv)
    if args.prompts < 1:
        parser.error("--prompts must be at least 1")

    try:
        check_model_folder(args.parity, "--parity")  # the trainer's checks and words, before anything loads
        report = run_parity(args.parity, args.overrides, args.prompts, args.top, args.config_name)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"npu-rl doctor: {exc}", file=sys.stderr)
        return 2
    print(report)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
