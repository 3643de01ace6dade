"""A secret from the environment never becomes a folder name (issue 39): ``trainer.experiment_name=
${oc.env:WANDB_API_KEY}`` made ``checkpoints/<project>/<the key>`` (and the trackers' run name) in plain text, although
config.yaml masked it. Refused at validation, naming the key and the variable, the value never shown; a variable that
is not a secret (``${oc.env:RUN_NAME}``) is a name like any other."""

from __future__ import annotations

import os

import pytest

from npu_rl.config.errors import ConfigError
from npu_rl.config.loader import load_config
from npu_rl.trainer.preflight import check, run_folder_problems
from tests.trainer.conftest import base_overrides

KEY = "wk-4e1f2a9c77d0"


def config_with(tmp_path, monkeypatch, *overrides):
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    monkeypatch.setenv("RUN_NAME", "grpo-lr1e-6")
    monkeypatch.chdir(tmp_path)
    return load_config([o for o in base_overrides("unused", "unused") if not o.startswith("trainer.default_local_dir")]
                       + list(overrides), "ppo_trainer")


def test_a_secret_from_the_environment_as_experiment_name_is_refused_naming_key_and_variable(tmp_path, monkeypatch):
    config = config_with(tmp_path, monkeypatch, "trainer.experiment_name=${oc.env:WANDB_API_KEY}")
    assert config.trainer.default_local_dir.endswith(KEY)  # the default folder is built from the name
    problems = run_folder_problems(config)
    assert [p.split(" holds ")[0] for p in problems] == ["trainer.experiment_name", "trainer.default_local_dir"]
    assert all("the environment variable WANDB_API_KEY (<redacted>), a secret" in p for p in problems)
    with pytest.raises(ConfigError) as info:
        check(config, check_device=False)
    assert KEY not in str(info.value) and "WANDB_API_KEY" in str(info.value)
    assert not os.listdir(tmp_path)  # no folder made, nothing written


def test_the_value_is_found_however_it_came(tmp_path, monkeypatch):
    """A shell's $WANDB_API_KEY reaches the config as text: the same value, the same refusal."""
    config = config_with(tmp_path, monkeypatch, f"trainer.project_name=team-{KEY}")
    assert [p.split(" holds ")[0] for p in run_folder_problems(config)] == ["trainer.project_name",
                                                                           "trainer.default_local_dir"]


def test_a_variable_that_is_not_a_secret_is_a_name(tmp_path, monkeypatch):
    config = config_with(tmp_path, monkeypatch, "trainer.experiment_name=${oc.env:RUN_NAME}",
                         f"trainer.default_local_dir={tmp_path / 'out'}")
    assert config.trainer.experiment_name == "grpo-lr1e-6"
    assert run_folder_problems(config) == []


def test_a_secret_named_variable_holding_a_path_is_not_a_secret_value(tmp_path, monkeypatch):
    monkeypatch.setenv("SECRETS_DIR", str(tmp_path))  # in every path under tmp_path
    config = config_with(tmp_path, monkeypatch, f"trainer.default_local_dir={tmp_path / 'out'}")
    assert run_folder_problems(config) == []
