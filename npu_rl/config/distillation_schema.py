"""``distillation.*`` (verl's names): on-policy distillation from one frozen teacher or several routed by a row
field, the teachers' pool and the distillation loss. Part of the tree in ``npu_rl/config/schema.py``; each field's
description is the docstring under it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from npu_rl.config.engine_schema import RefFSDPConfig
from npu_rl.config.rules import broken, finite, pool_size_rules


@dataclass
class DistillationLossConfig:
    """verl's ``distillation.distillation_loss`` (formulas: npu_rl/core/distillation.py, docs/algorithms.md)."""

    loss_mode: str = "k3"
    """the reverse-KL estimator at the student's sampled tokens: k1 (kl) | k2 (mse) | k3 (low_var_kl) | abs; or
    forward_kl_topk: the forward KL over the teacher's top-k tokens at each position (topk)"""
    topk: Optional[int] = 32
    """forward_kl_topk: how many of the teacher's most likely tokens per position (K); other modes ignore it"""
    use_task_rewards: bool = True
    """True: the actor's PPO/GRPO loss plus distillation_loss_coef x the distillation loss; False: the distillation
    loss alone (the policy loss, its entropy and KL terms are dropped)"""
    distillation_loss_coef: float = 1.0
    """the distillation loss's weight when use_task_rewards=True"""
    loss_max_clamp: Optional[float] = None
    """per-token losses clamped to [-c, c]; null: no clamp"""
    log_prob_min_clamp: Optional[float] = None
    """forward_kl_topk: the student's and the teacher's top-k log-probs clamped from below at this value; null: no
    clamp"""
    use_policy_gradient: bool = False
    """True: the negative per-token loss is the advantage of a clipped PPO update (k1 recommended); False: the loss
    is backpropagated directly (k3 recommended; k1 is refused there)"""
    policy_loss_mode: str = "vanilla"
    """the policy loss of use_policy_gradient=True; only vanilla (as in verl)"""
    clip_ratio: float = 0.2
    """the clip ratio of use_policy_gradient=True where clip_ratio_low / clip_ratio_high are null"""
    clip_ratio_low: Optional[float] = 0.2
    clip_ratio_high: Optional[float] = 0.2

    def check(self, key: str) -> list[str]:
        return broken(
            (self.loss_max_clamp is None or (finite(self.loss_max_clamp) and self.loss_max_clamp > 0),
             f"{key}.loss_max_clamp={self.loss_max_clamp} must be > 0 (or null: no clamp)"),
            *((value is None or (finite(value) and value >= 0), f"{key}.{name}={value} must be >= 0")
              for name, value in (("clip_ratio", self.clip_ratio), ("clip_ratio_low", self.clip_ratio_low),
                                  ("clip_ratio_high", self.clip_ratio_high))),
        )


@dataclass
class DistillationTeacherConfig:
    """A frozen teacher: its log-probs on the student's sampled tokens are computed in the step by a forward-only
    engine (npu_rl/workers/teacher.py), beside the actor like the reference's or on the teacher pool
    (distillation.nnodes)."""

    key: Optional[str] = None
    """several teachers: the value of the row's distillation.teacher_key field (e.g. its data_source) whose rows this
    teacher scores; one teacher scores every row and needs none"""
    model_path: Optional[str] = None
    """the teacher's model folder (or Hub id / built-in name, as actor_rollout_ref.model.path), any size; its
    vocabulary must cover the student's tokenizer (the student's token ids are scored as they are)"""
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)
    """npu-rl: the teacher's own dtype (model_dtype, mixed_precision.param_dtype) and param_offload"""


DEFAULT_TEACHER = "teacher_model"  # verl's name of the single teacher's entry


@dataclass
class DistillationConfig:
    """verl's ``distillation.*``: on-policy distillation from one frozen teacher, or several routed by a field of each
    row (multi-teacher on-policy distillation, MOPD; docs/algorithms.md)."""

    enabled: bool = False
    """the actor's loss adds (or becomes) the reverse KL to the teacher on the student's own samples"""
    n_gpus_per_node: int = 8
    """the teacher pool's devices per node (read when nnodes >= 1)"""
    nnodes: int = 0
    """the teacher pool's nodes: >= 1 runs the teachers on their own nnodes x n_gpus_per_node devices (their own
    worker group, one process per device, each teacher's weights sharded over all of them with FSDP2), as verl does;
    npu-rl: 0 (the default) runs them on the trainer's devices beside the actor, like the reference"""
    teacher_models: dict[str, DistillationTeacherConfig] = field(
        default_factory=lambda: {DEFAULT_TEACHER: DistillationTeacherConfig()})
    """the teachers by entry name: teacher_model alone (every row goes to it), or several entries added with
    +distillation.teacher_models.<name>.{key,model_path,...} (then, as in verl, the teacher_model entry is dropped:
    setting its model_path beside others is refused)"""
    teacher_key: str = "data_source"
    """several teachers: the row field whose value picks the row's teacher (a teacher's key)"""
    distillation_loss: DistillationLossConfig = field(default_factory=DistillationLossConfig)

    def teacher_entries(self) -> dict[str, DistillationTeacherConfig]:
        """``{entry name: teacher}`` of the teachers in use (verl's rule): teacher_model alone, or every other
        entry when others are named."""
        if set(self.teacher_models) == {DEFAULT_TEACHER}:
            return dict(self.teacher_models)
        return {name: t for name, t in self.teacher_models.items() if name != DEFAULT_TEACHER}

    def teachers(self) -> dict[str, DistillationTeacherConfig]:
        """``{routing key: teacher}``: the one teacher under key ``default`` (it scores every row), or each teacher
        under its ``key``."""
        entries = self.teacher_entries()
        if set(entries) == {DEFAULT_TEACHER}:
            return {"default": entries[DEFAULT_TEACHER]}
        return {str(t.key): t for t in entries.values()}

    def check(self, key: str) -> list[str]:
        pools = pool_size_rules(key, self.nnodes, self.n_gpus_per_node, own_pool=self.enabled and self.nnodes != 0)
        if not self.enabled:
            return broken(*pools)
        models = f"{key}.teacher_models"
        if set(self.teacher_models) == {DEFAULT_TEACHER}:
            return broken((bool(self.teacher_models[DEFAULT_TEACHER].model_path),
                           f"{key}.enabled=True needs {models}.{DEFAULT_TEACHER}.model_path=<teacher folder>"), *pools)
        named = {n: t for n, t in self.teacher_models.items() if n != DEFAULT_TEACHER}
        keys = [t.key for t in named.values()]
        return broken(
            (not self.teacher_models.get(DEFAULT_TEACHER, DistillationTeacherConfig()).model_path,
             f"{models}.{DEFAULT_TEACHER}.model_path is set beside other teachers ({', '.join(named)}): verl drops "
             f"the {DEFAULT_TEACHER} entry silently when others are named; give that teacher a name of its own "
             f"(+{models}.<name>.key / .model_path)"),
            *((bool(t.model_path), f"{models}.{n}.model_path=<teacher folder> is missing") for n, t in named.items()),
            *((t.key is not None and str(t.key) != "", f"{models}.{n}.key is missing: with several teachers each "
               f"names the {key}.teacher_key={self.teacher_key} value of the rows it scores") for n, t in named.items()),
            (len(set(keys)) == len(keys), f"{models}: two teachers share a key ({keys}); each key picks one teacher"),
            (bool(self.teacher_key), f"{key}.teacher_key must name a row field (e.g. data_source)"),
            *pools)
