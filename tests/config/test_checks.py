"""The preflight's checks (npu_rl/trainer/preflight.py) and the config's own rules (each slice's ``check(key)``):
degenerate numbers refused naming the key, the config never changed by loading or checking, one home for each list
of allowed names."""

from __future__ import annotations

import ast
import collections
import copy
import dataclasses
import pathlib

import pytest

import npu_rl
from npu_rl.config.errors import ConfigError
from npu_rl.config.loader import load_config
from npu_rl.config.rules import slice_problems
from npu_rl.config.schema import PPOConfig
from npu_rl.trainer.preflight import check, run_settings_for

SMALL = ["trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
         "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "algorithm.adv_estimator=grpo"]
RC = "algorithm.rollout_correction"


def problems(*overrides) -> list[str]:
    try:
        check(load_config(SMALL + list(overrides)), check_paths=False, check_device=False)
    except ConfigError as exc:
        return exc.problems
    return []


def test_the_small_config_passes():
    assert problems() == []


# issue 29: settings that ran and reported success (or died steps later inside a library) are refused up front
@pytest.mark.parametrize("override, key", [
    ("actor_rollout_ref.actor.optim.lr=inf", "actor_rollout_ref.actor.optim.lr=inf"),
    ("actor_rollout_ref.actor.optim.lr=nan", "actor_rollout_ref.actor.optim.lr=nan"),
    ("critic.optim.lr=inf", "critic.optim.lr=inf"),
    ("actor_rollout_ref.actor.entropy_coeff=inf", "actor_rollout_ref.actor.entropy_coeff=inf"),
    ("actor_rollout_ref.actor.kl_loss_coef=inf", "actor_rollout_ref.actor.kl_loss_coef=inf"),
    ("algorithm.kl_ctrl.kl_coef=nan", "algorithm.kl_ctrl.kl_coef=nan"),
    ("actor_rollout_ref.actor.grad_clip=0", "actor_rollout_ref.actor.grad_clip=0"),
    ("actor_rollout_ref.actor.grad_clip=inf", "actor_rollout_ref.actor.grad_clip=inf"),
    ("critic.grad_clip=0", "critic.grad_clip=0"),
    ("actor_rollout_ref.actor.clip_ratio_c=inf", "actor_rollout_ref.actor.clip_ratio_c=inf"),
    ("actor_rollout_ref.rollout.temperature=inf", "actor_rollout_ref.rollout.temperature=inf"),
    ("actor_rollout_ref.rollout.agent.sample_timeout_s=0", "actor_rollout_ref.rollout.agent.sample_timeout_s=0"),
    ("actor_rollout_ref.rollout.agent.sample_timeout_s=-1", "actor_rollout_ref.rollout.agent.sample_timeout_s=-1"),
    ("actor_rollout_ref.rollout.agent.sample_timeout_s=inf", "actor_rollout_ref.rollout.agent.sample_timeout_s=inf"),
    ("actor_rollout_ref.rollout.agent.sample_timeout_s=nan", "actor_rollout_ref.rollout.agent.sample_timeout_s=nan"),
    # issue 39: a bucket of 0 MB hung the one-step-off and fully-async weight sync after Ray started
    ("actor_rollout_ref.rollout.update_weights_bucket_megabytes=0",
     "actor_rollout_ref.rollout.update_weights_bucket_megabytes=0 must be > 0"),
    ("actor_rollout_ref.rollout.update_weights_bucket_megabytes=-5",
     "actor_rollout_ref.rollout.update_weights_bucket_megabytes=-5 must be > 0"),
])
def test_non_finite_or_degenerate_numbers_are_refused_naming_the_key(override, key):
    found = problems(override)
    assert len(found) == 1 and found[0].startswith(key), found


# issue 39: one rule for every float key of the schema (finite), not a rule per key; each was accepted before and
# failed after the models loaded with torch's raw message, or never (a NaN min_lr_ratio skipped every update)
@pytest.mark.parametrize("key, value", [
    ("actor_rollout_ref.actor.optim.min_lr_ratio", "nan"), ("actor_rollout_ref.actor.optim.weight_decay", "nan"),
    ("actor_rollout_ref.actor.optim.eps", "inf"), ("critic.optim.lr_warmup_steps_ratio", "nan"),
    ("actor_rollout_ref.actor.optim.betas", "[0.9,nan]"), ("algorithm.gamma", "nan"), ("algorithm.lam", "-inf"),
    ("reward_model.timeout_s", "inf"), ("reward_model.timeout_s", "nan"), ("reward_model.batch_timeout_s", "nan"),
    ("async_training.staleness_threshold", "nan"), ("async_training.dynamic_schedule_deactivate_ratio", "nan"),
    ("actor_rollout_ref.actor.policy_loss.clip_cov_ub", "inf"), ("algorithm.gdpo_reward_weights", "[1.0,inf]"),
])
def test_every_float_key_must_be_finite(key, value):
    found = problems(f"{key}={value}")
    assert len(found) == 1 and found[0].startswith(f"{key}=") and "finite" in found[0], found


@pytest.mark.parametrize("override, words", [
    ("actor_rollout_ref.actor.optim.min_lr_ratio=1.5", "min_lr_ratio=1.5 must be in [0, 1]"),
    ("actor_rollout_ref.actor.optim.weight_decay=-0.1", "weight_decay=-0.1 must be >= 0"),
    ("critic.optim.eps=0", "eps=0.0 must be > 0"),
    ("actor_rollout_ref.actor.optim.betas=[0.9,1.0]", "betas=[0.9, 1.0] must be two numbers in [0, 1)"),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=2", "lr_warmup_steps_ratio=2.0 must be in [0, 1]"),
    ("algorithm.gamma=1.5", "algorithm.gamma=1.5 must be in [0, 1]"),
])
def test_float_keys_out_of_their_range_are_refused(override, words):
    found = problems(override)
    assert len(found) == 1 and words in found[0], found


def test_every_float_key_of_the_schema_is_under_the_finite_rule():
    """The rule reads the schema's types: a float key added tomorrow is covered without a line written for it."""
    config = PPOConfig()
    count = 0
    for path, owner, name in _float_keys(config):
        setattr(owner, name, [float("nan")] if isinstance(getattr(owner, name), list) else float("nan"))
        count += 1
    found = slice_problems(config)
    for path, _, _ in _float_keys(PPOConfig()):
        assert any(p.startswith(f"{path}=") for p in found), path
    assert count >= 40


def _float_keys(node, prefix=""):
    from npu_rl.config.rules import _float_fields

    for name, _ in _float_fields(type(node)):
        yield f"{prefix}{name}", node, name
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            yield from _float_keys(value, f"{prefix}{f.name}.")


@pytest.mark.parametrize("overrides", [
    [f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=inf"],
    [f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold='0.5_inf'"],
    [f"{RC}.rollout_rs=token_k1", f"{RC}.rollout_rs_threshold=inf"],
    [f"{RC}.rollout_rs=seq_max_k2", f"{RC}.rollout_rs_threshold=inf"],
])
def test_infinite_rollout_correction_thresholds_are_refused(overrides):
    found = problems(*overrides)
    assert len(found) == 1 and found[0].startswith(f"{RC}.rollout_") and "finite" in found[0], found


def test_every_slice_rule_is_reached_with_its_full_key():
    """The walk asks every slice in the tree: each check() method of the schema reports under its full key."""
    config = PPOConfig()
    config.critic.optim.lr = float("inf")
    config.actor_rollout_ref.rollout.val_kwargs.n = 0
    config.algorithm.filter_groups.enable, config.algorithm.filter_groups.max_num_gen_batches = True, -1
    found = slice_problems(config)
    for key in ("critic.optim.lr=inf", "actor_rollout_ref.rollout.val_kwargs.n", "algorithm.filter_groups."
                "max_num_gen_batches"):
        assert any(p.startswith(key) for p in found), (key, found)


def test_loading_and_checking_never_change_the_config():
    """What verl's workers rewrite (global micro-batch sizes, the rollout log-probs rollout correction needs) is
    in the plan; the config stays as written."""
    config = load_config(SMALL + ["actor_rollout_ref.actor.ppo_micro_batch_size=4", f"{RC}.rollout_is=token"])
    before = copy.deepcopy(config)
    check(config, check_paths=False, check_device=False)
    run_settings = run_settings_for(config)
    assert config == before
    assert config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is None
    assert run_settings.micro_batches.actor_update == 4 and run_settings.rollout_logprobs


def test_the_config_room_checks_nothing_it_cannot_see():
    """load_config composes and resolves only: a config the preflight refuses still loads."""
    config = load_config(SMALL + ["actor_rollout_ref.actor.optim.lr=inf", "actor_rollout_ref.rollout.name=nope"])
    assert config.actor_rollout_ref.rollout.name == "nope"
    found = problems("actor_rollout_ref.actor.optim.lr=inf", "actor_rollout_ref.rollout.name=nope")
    assert any(p.startswith("actor_rollout_ref.rollout.name='nope' is not one of vllm, hf") for p in found), found


def test_no_list_of_names_is_written_twice():
    """One home for each allowed-value list: no two module-level tuples / lists / sets of strings in npu_rl/ hold
    the same names (the list lives with the code that implements the names; validation reads it there)."""
    seen = collections.defaultdict(list)
    for path in pathlib.Path(npu_rl.__file__).parent.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, (ast.Tuple, ast.List, ast.Set)) and len(value.elts) >= 2 and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts):
                seen[frozenset(e.value for e in value.elts)].append(f"{path.name}:{node.lineno}")
    twice = {tuple(sorted(names)): where for names, where in seen.items() if len(where) > 1}
    assert not twice, twice


def test_each_slice_check_returns_problems_not_raises():
    for cls in _schema_classes():
        if hasattr(cls, "check"):
            assert cls().check("x") == [], cls.__name__  # the defaults keep every rule


def _schema_classes():
    out, todo = [], [PPOConfig]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo += [f.default_factory().__class__ for f in dataclasses.fields(cls)
                 if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory())]
    return out
