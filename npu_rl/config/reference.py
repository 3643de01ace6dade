"""The config reference (docs/config_reference.md), generated from the schema: every key, its type, its default and
what it does. ``python -m npu_rl.config.reference > docs/config_reference.md`` regenerates the page; a test keeps
the committed page equal to this output.

The description of a key is the comment on its line in ``config/schema.py`` when there is one, else the entry in
:data:`DESCRIPTIONS` below; keys with neither say so (they mean what they mean in verl).
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import sys
import tokenize
import typing

from npu_rl.config import schema

# Keys without a comment in the schema that users reach for most often.
DESCRIPTIONS = {
    "data.tokenizer": "tokenizer folder when it differs from the actor's model path",
    "data.prompt_key": "column holding the chat messages of each row",
    "data.reward_fn_key": "column that picks the reward scorer (data_source)",
    "data.max_prompt_length": "prompts longer than this are handled by data.truncation",
    "data.max_response_length": "maximum generated tokens per response",
    "data.shuffle": "shuffle the training prompts every epoch (seeded by data.seed)",
    "data.dataloader_num_workers": "data loader worker processes (0: in the main process)",
    "data.filter_overlong_prompts": "drop prompts longer than max_prompt_length when loading",
    "actor_rollout_ref.model.path": "Hugging Face folder, hub id (when online) or the embedded smollm2-135m-instruct",
    "actor_rollout_ref.model.enable_gradient_checkpointing": "recompute activations in the backward pass",
    "actor_rollout_ref.model.use_remove_padding": "pack the batch's sequences without padding tokens",
    "actor_rollout_ref.model.use_fused_kernels": "log-probs and entropy from hidden states without full logits",
    "actor_rollout_ref.model.trust_remote_code": "allow the model folder's own Python code",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "prompts per optimizer step (times rollout.n responses)",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "rows per forward/backward pass on one device",
    "actor_rollout_ref.actor.use_dynamic_bsz": "micro-batches by token count instead of row count",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "token budget of one micro-batch with use_dynamic_bsz",
    "actor_rollout_ref.actor.clip_ratio": "PPO clip range (both sides unless clip_ratio_low/high are set)",
    "actor_rollout_ref.actor.clip_ratio_low": "lower clip range (DAPO's asymmetric clipping)",
    "actor_rollout_ref.actor.clip_ratio_high": "upper clip range (DAPO: 0.28)",
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm",
    "actor_rollout_ref.actor.entropy_coeff": "entropy bonus weight in the actor loss",
    "actor_rollout_ref.actor.use_kl_loss": "add a KL-to-reference term to the actor loss (GRPO)",
    "actor_rollout_ref.actor.kl_loss_coef": "weight of the KL loss",
    "actor_rollout_ref.actor.kl_loss_type": "kl (k1) | abs | mse (k2) | low_var_kl (k3)",
    "actor_rollout_ref.actor.use_torch_compile": "compile the RMSNorm and MLP blocks of training forwards (CUDA only)",
    "actor_rollout_ref.ref.use_torch_compile": "compile the reference's RMSNorm and MLP blocks (CUDA only)",
    "actor_rollout_ref.actor.ppo_epochs": "passes over each batch",
    "actor_rollout_ref.actor.shuffle": "shuffle rows between mini-batches",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "devices one sequence is split over (Ulysses)",
    "actor_rollout_ref.actor.grad_clip": "gradient norm clipping threshold",
    "actor_rollout_ref.actor.optim.lr": "learning rate",
    "actor_rollout_ref.actor.optim.weight_decay": "AdamW weight decay",
    "actor_rollout_ref.rollout.name": "hf | vllm (falls back to hf when vLLM is missing)",
    "actor_rollout_ref.rollout.n": "responses sampled per prompt (the group size of GRPO)",
    "actor_rollout_ref.rollout.temperature": "sampling temperature",
    "actor_rollout_ref.rollout.top_p": "nucleus sampling",
    "actor_rollout_ref.rollout.top_k": "top-k sampling (-1: off)",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "vLLM tensor parallel size",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "share of device memory vLLM may take",
    "actor_rollout_ref.rollout.enforce_eager": "no CUDA/ACL graphs in vLLM",
    "actor_rollout_ref.rollout.free_cache_engine": "release vLLM's KV cache while training",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "rows per pass when recomputing log-probs",
    "algorithm.adv_estimator": "gae | grpo | rloo | reinforce_plus_plus | remax | ... (docs/algorithms.md)",
    "algorithm.gamma": "discount factor (GAE)",
    "algorithm.lam": "GAE lambda",
    "algorithm.use_kl_in_reward": "subtract a KL penalty from the reward (PPO)",
    "algorithm.norm_adv_by_std_in_grpo": "divide GRPO advantages by the group's standard deviation",
    "trainer.total_epochs": "passes over the training prompts",
    "trainer.total_training_steps": "stop after this many steps (overrides total_epochs when set)",
    "trainer.project_name": "tracker project name",
    "trainer.experiment_name": "tracker run name",
    "trainer.logger": "console | file | tensorboard | wandb | swanlab | mlflow | trackio | clearml (docs/tracking.md)",
    "trainer.log_val_generations": "validation samples per validation kept in val_generations.jsonl and trackers",
    "trainer.nnodes": "nodes",
    "trainer.n_gpus_per_node": "devices (GPUs or NPUs) per node",
    "trainer.save_freq": "checkpoint every N steps (-1: never)",
    "trainer.test_freq": "validate every N steps (-1: never)",
    "trainer.val_before_train": "validate once before the first step",
    "trainer.default_local_dir": "checkpoints and logs/<time>/ run folders go here",
    "trainer.resume_mode": "auto | disable | resume_path",
    "trainer.device": "auto | npu | cuda | cpu (verl: cuda)",
}


def _field_comments(cls) -> dict[str, str]:
    """``{field: trailing comment}`` from the class's source."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    current = None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and tok.start[1] == 4 and current is None:
            current = tok.string
        elif tok.type == tokenize.COMMENT and current:
            text = tok.string.lstrip("# ").strip()
            if not text.startswith(("type:", "noqa")):  # a checker's pragma is not a description
                out[current] = text
        if tok.type == tokenize.NEWLINE:
            current = None
    return out


def _type_name(tp) -> str:
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Union and type(None) in args:
        return " or ".join(_type_name(a) for a in args if a is not type(None)) + " or None"
    if tp is typing.Any:
        return "any"
    if typing.get_origin(tp) is not None:
        return str(tp).replace("typing.", "")
    return getattr(tp, "__name__", str(tp))


def walk(cls=None, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every leaf key, in schema order."""
    from npu_rl.config.validate import NO_EFFECT

    cls = cls or schema.PPOConfig
    hints = typing.get_type_hints(cls)
    comments = _field_comments(cls)
    rows = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints.get(f.name, f.type)
        if dataclasses.is_dataclass(tp):
            rows += walk(tp, key + ".")
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        else:
            default = "(required)"
        desc = comments.get(f.name) or DESCRIPTIONS.get(key, "")
        if key in NO_EFFECT:
            desc = f"no effect in npu-rl (kept for verl scripts): {NO_EFFECT[key]}"
        rows.append((key, _type_name(tp), repr(default) if not isinstance(default, str) else default, desc))
    return rows


def markdown() -> str:
    lines = [
        "# Config reference",
        "",
        "Every key of the config tree with its type, its default and what it does, generated from",
        "`npu_rl/config/schema.py` (`python -m npu_rl.config.reference > docs/config_reference.md`; a test keeps this",
        "page in step). Keys are verl's; where npu-rl's default differs from verl's the description says so. A key",
        "with no description here means what it means in verl. `${...}` defaults follow another key unless set.",
        "`npu-rl train --cfg job` prints the resolved values of a run; docs/configuration.md explains how configs",
        "are composed.",
        "",
    ]
    section = None
    for key, tp, default, desc in walk():
        parts = key.split(".")
        top = ".".join(parts[:2]) if parts[0] == "actor_rollout_ref" and len(parts) > 2 else parts[0]
        if top != section:
            section = top
            lines += ["", f"## {section}", "", "| key | type | default | what it does |", "| --- | --- | --- | --- |"]
        cell = default.replace("|", "\\|")
        lines.append(f"| `{key}` | {tp.replace('|', '/')} | `{cell}` | {desc.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
