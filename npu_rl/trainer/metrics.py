"""Step metrics with the keys verl users know (verl's metric names; docs/trainer.md lists them), read off the device in one transfer per step."""

from __future__ import annotations

import torch

from npu_rl.protocol import Batch


def to_floats(metrics: dict[str, torch.Tensor | float | int]) -> dict[str, float]:
    """0-d tensors -> floats with a single device-to-host copy."""
    tensor_keys = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, torch.Tensor)}
    if tensor_keys:
        values = torch.stack([metrics[k].detach().float().reshape(()).cpu() for k in tensor_keys]).tolist()
        out.update(zip(tensor_keys, values))
    return out


def _stats(prefix: str, values: torch.Tensor) -> dict[str, torch.Tensor]:
    values = values.float()
    if values.numel() == 0:
        values = torch.zeros(1)
    return {f"{prefix}/mean": values.mean(), f"{prefix}/max": values.max(), f"{prefix}/min": values.min()}


def _masked_stats(prefix: str, values: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    return _stats(prefix, values[mask.bool()])


def data_metrics(batch: Batch, max_prompt_length: int, max_response_length: int,
                 use_critic: bool) -> dict[str, torch.Tensor]:
    """Scores, rewards, advantages, returns, values and lengths of a finished step's batch."""
    response_mask = batch["response_mask"].bool()
    prompt_mask = batch["attention_mask"][:, : -max_response_length].bool()
    response_length = response_mask.sum(-1).float()
    prompt_length = prompt_mask.sum(-1).float()
    metrics: dict[str, torch.Tensor] = {}
    metrics |= _stats("critic/score", batch["token_level_scores"].sum(-1))
    metrics |= _stats("critic/rewards", batch["token_level_rewards"].sum(-1))
    metrics |= _masked_stats("critic/advantages", batch["advantages"], response_mask)
    metrics |= _masked_stats("critic/returns", batch["returns"], response_mask)
    if use_critic:
        values = batch["values"]
        metrics |= _masked_stats("critic/values", values, response_mask)
        returns = batch["returns"][response_mask]
        residual_var = torch.var(returns - values[response_mask])
        metrics["critic/vf_explained_var"] = 1.0 - residual_var / (torch.var(returns) + 1e-5)
    metrics |= _stats("response_length", response_length)
    metrics["response_length/clip_ratio"] = (response_length >= max_response_length).float().mean()
    metrics |= _stats("prompt_length", prompt_length)
    metrics["prompt_length/clip_ratio"] = (prompt_length >= max_prompt_length).float().mean()
    return metrics


def throughput_metrics(num_tokens: int, step_seconds: float, num_devices: int) -> dict[str, float]:
    return {
        "perf/total_num_tokens": float(num_tokens),
        "perf/time_per_step": step_seconds,
        "perf/throughput": num_tokens / max(step_seconds, 1e-9) / max(num_devices, 1),
    }


def masked_mean_tensor(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.float()
    return (values.float() * mask).sum() / mask.sum().clamp(min=1.0)


# A step's non-finite metric -> what most likely made it so (the first one found is named to the user).
NONFINITE_CAUSES = (
    ("critic/score/mean", "the reward function returned a non-finite score (custom_reward_function / the scorer)"),
    ("critic/advantages/mean", "the advantages: the scores or algorithm.* settings (e.g. the KL-in-reward coefficient "
                               "algorithm.kl_ctrl.kl_coef)"),
    ("actor/pg_loss", "the policy loss: actor_rollout_ref.actor.optim.lr, the clip ratios or the advantages"),
    ("actor/kl_loss", "the KL loss: actor_rollout_ref.actor.kl_loss_coef / kl_loss_type"),
    ("actor/entropy", "the entropy: actor_rollout_ref.actor.entropy_coeff or the rollout temperature"),
    ("critic/vf_loss", "the value loss: critic.optim.lr or critic.cliprange_value"),
    ("actor/grad_norm", "the actor's gradient norm with finite loss terms: a loss coefficient "
                        "(actor_rollout_ref.actor.entropy_coeff, kl_loss_coef) or actor_rollout_ref.actor.optim.lr"),
    ("critic/grad_norm", "the critic's gradient norm: critic.optim.lr"),
)


def nonfinite_terms(metrics: dict[str, float]) -> list[str]:
    """The step metrics (among the loss terms, scores and gradient norms) that are NaN or infinite, in the order of
    ``NONFINITE_CAUSES``."""
    import math

    return [key for key, _ in NONFINITE_CAUSES if key in metrics and not math.isfinite(metrics[key])]


def likely_cause(metrics: dict[str, float]) -> str:
    terms = nonfinite_terms(metrics)
    if not terms:
        return "no loss term is NaN/inf in the step's means (a single mini-batch was): check the scores and " \
            "actor_rollout_ref.actor.optim.lr"
    causes = dict(NONFINITE_CAUSES)
    return f"{', '.join(terms)} went non-finite; likely {causes[terms[0]]}"
