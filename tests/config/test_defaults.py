"""One home for each default: the schema. The core's input dataclasses and factories keep defaults only for
convenience in tests and notebooks, and every one that stands for a config key must equal the schema's (a change
of a default in the schema that is not made here fails this test); any other default they hold is listed as not
a config value."""

from __future__ import annotations

import dataclasses
import inspect

from npu_rl.config.schema import PPOConfig
from npu_rl.core import PolicyLossInputs, make_kl_controller, resolved_clip_ratios
from npu_rl.core.rollout_correction import RolloutCorrectionSpec

ACTOR = "actor_rollout_ref.actor"
# (owner, parameter) -> the config key whose default it must equal
PINNED = {
    (PolicyLossInputs, "loss_agg_mode"): f"{ACTOR}.loss_agg_mode",
    (PolicyLossInputs, "loss_scale_factor"): f"{ACTOR}.loss_scale_factor",
    (PolicyLossInputs, "clip_ratio_c"): f"{ACTOR}.clip_ratio_c",
    (PolicyLossInputs, "clip_cov_ratio"): f"{ACTOR}.policy_loss.clip_cov_ratio",
    (PolicyLossInputs, "clip_cov_lb"): f"{ACTOR}.policy_loss.clip_cov_lb",
    (PolicyLossInputs, "clip_cov_ub"): f"{ACTOR}.policy_loss.clip_cov_ub",
    (PolicyLossInputs, "kl_cov_ratio"): f"{ACTOR}.policy_loss.kl_cov_ratio",
    (PolicyLossInputs, "ppo_kl_coef"): f"{ACTOR}.policy_loss.ppo_kl_coef",
    (PolicyLossInputs, "tau_pos"): f"{ACTOR}.tau_pos",
    (PolicyLossInputs, "tau_neg"): f"{ACTOR}.tau_neg",
    (PolicyLossInputs, "dro_beta"): f"{ACTOR}.policy_loss.dro_beta",
    (PolicyLossInputs, "kl_loss_type"): f"{ACTOR}.kl_loss_type",
    (RolloutCorrectionSpec, "rollout_is"): "algorithm.rollout_correction.rollout_is",
    (RolloutCorrectionSpec, "rollout_is_threshold"): "algorithm.rollout_correction.rollout_is_threshold",
    (RolloutCorrectionSpec, "rollout_is_batch_normalize"): "algorithm.rollout_correction.rollout_is_batch_normalize",
    (RolloutCorrectionSpec, "rollout_rs"): "algorithm.rollout_correction.rollout_rs",
    (RolloutCorrectionSpec, "rollout_rs_threshold"): "algorithm.rollout_correction.rollout_rs_threshold",
    (RolloutCorrectionSpec, "loss_type"): "algorithm.rollout_correction.loss_type",
    (make_kl_controller, "target_kl"): "algorithm.kl_ctrl.target_kl",
    (make_kl_controller, "horizon"): "algorithm.kl_ctrl.horizon",
}
# defaults that are not a config key's: optional tensors, the loss's denominators, bypass mode's settings
NOT_CONFIG = {
    (PolicyLossInputs, "global_num_tokens"), (PolicyLossInputs, "global_num_seqs"),
    (PolicyLossInputs, "rollout_is_weights"), (PolicyLossInputs, "ref_logprobs"),
    (PolicyLossInputs, "rollout_correction"),
}
# the resolved clip range: clip_ratio_low / clip_ratio_high default to null in the schema, meaning clip_ratio
DERIVED = {(PolicyLossInputs, "clip_ratio_low"): 0, (PolicyLossInputs, "clip_ratio_high"): 1}


def _schema_default(key: str):
    node = PPOConfig()
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _defaults(owner) -> dict[str, object]:
    if dataclasses.is_dataclass(owner):
        return {f.name: f.default for f in dataclasses.fields(owner) if f.default is not dataclasses.MISSING}
    return {name: p.default for name, p in inspect.signature(owner).parameters.items()
            if p.default is not inspect.Parameter.empty}


def test_every_default_of_the_core_inputs_is_the_schemas():
    actor = PPOConfig().actor_rollout_ref.actor
    clip = resolved_clip_ratios(actor.clip_ratio, actor.clip_ratio_low, actor.clip_ratio_high)
    for owner in {owner for owner, _ in [*PINNED, *NOT_CONFIG, *DERIVED]}:
        for name, default in _defaults(owner).items():
            where = (owner, name)
            assert where in PINNED or where in NOT_CONFIG or where in DERIVED, \
                f"{owner.__name__}.{name} has a default ({default!r}) that is neither pinned to a config key nor listed"
            if where in PINNED:
                assert default == _schema_default(PINNED[where]), \
                    f"{owner.__name__}.{name}={default!r} but the schema's {PINNED[where]} is " \
                    f"{_schema_default(PINNED[where])!r}"
            elif where in DERIVED:
                assert default == clip[DERIVED[where]], (owner.__name__, name, default, clip)
