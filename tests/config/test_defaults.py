"""One home for each default: the schema. ``PolicyLossInputs`` takes every setting from its caller; the few other
core inputs that keep a default for convenience (``RolloutCorrectionSpec``, ``make_kl_controller``) must hold the
schema's (a default changed in the schema and not there fails this test); any other default they hold is listed as
not a config value."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from npu_rl.config.schema import PPOConfig
from npu_rl.core import PolicyLossInputs, make_kl_controller
from npu_rl.core.rollout_correction import RolloutCorrectionSpec
from tests.core.policy_inputs import schema_settings

RC = "algorithm.rollout_correction"
# (owner, parameter) -> the config key whose default it must equal
PINNED = {
    (RolloutCorrectionSpec, "rollout_is"): f"{RC}.rollout_is",
    (RolloutCorrectionSpec, "rollout_is_threshold"): f"{RC}.rollout_is_threshold",
    (RolloutCorrectionSpec, "rollout_is_batch_normalize"): f"{RC}.rollout_is_batch_normalize",
    (RolloutCorrectionSpec, "rollout_rs"): f"{RC}.rollout_rs",
    (RolloutCorrectionSpec, "rollout_rs_threshold"): f"{RC}.rollout_rs_threshold",
    (RolloutCorrectionSpec, "loss_type"): f"{RC}.loss_type",
    (make_kl_controller, "target_kl"): "algorithm.kl_ctrl.target_kl",
    (make_kl_controller, "horizon"): "algorithm.kl_ctrl.horizon",
}
# defaults that are not a config key's: optional tensors, the loss's denominators, bypass mode's settings
# (PolicyLossInputs takes every setting from the caller: tests build it with tests/core/policy_inputs.py)
NOT_CONFIG = {
    (PolicyLossInputs, "global_num_tokens"), (PolicyLossInputs, "global_num_seqs"),
    (PolicyLossInputs, "rollout_is_weights"), (PolicyLossInputs, "ref_logprobs"),
    (PolicyLossInputs, "rollout_correction"),
}


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
    for owner in {owner for owner, _ in [*PINNED, *NOT_CONFIG]}:
        defaults = _defaults(owner)
        for name, default in defaults.items():
            where = (owner, name)
            assert where in PINNED or where in NOT_CONFIG, \
                f"{owner.__name__}.{name} has a default ({default!r}) that is neither pinned to a config key nor listed"
            if where in PINNED:
                assert default == _schema_default(PINNED[where]), \
                    f"{owner.__name__}.{name}={default!r} but the schema's {PINNED[where]} is " \
                    f"{_schema_default(PINNED[where])!r}"
        stale = [name for o, name in [*PINNED, *NOT_CONFIG] if o is owner and name not in defaults]
        assert not stale, f"{owner.__name__}: listed here but without a default (remove them): {stale}"


def test_policy_loss_inputs_take_every_setting_from_the_caller():
    with pytest.raises(TypeError, match="clip_ratio_c"):
        PolicyLossInputs(None, None, None, None, **{k: v for k, v in schema_settings().items() if k != "clip_ratio_c"})
