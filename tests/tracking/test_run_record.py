"""The run record (``npu_rl/tracking/run_record.py``) masks what came from the environment: a ``${oc.env:NAME}``
value, whatever its key and whatever NAME, in config.yaml, the trackers' config and ``--cfg job``."""

from __future__ import annotations

import os

from npu_rl.config.loader import load_config, to_yaml
from npu_rl.tracking.run_record import recorded_config, save_run_record
from npu_rl.utils.redact import MASK


def test_values_from_the_environment_are_masked_whatever_key_and_name(tmp_path, monkeypatch):
    """issue 39: ``trainer.experiment_name=${oc.env:WANDB_API_KEY}`` and a reward kwarg filled from
    ``${oc.env:OPENAI_API_KEY}`` were written in plain text into config.yaml (the typed config had forgotten where
    its values came from); a variable with a plain name is masked too: the value was in the environment."""
    secrets = {"WANDB_API_KEY": "wk-4e1f", "OPENAI_API_KEY": "ok-9a2b", "JUDGE_HOST_CREDENTIAL": "cred-77c3"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    config = load_config(["trainer.experiment_name=${oc.env:WANDB_API_KEY}",
                          "+custom_reward_function.reward_kwargs.judge_auth=${oc.env:OPENAI_API_KEY}",
                          "+custom_reward_function.reward_kwargs.judge=[x, 'Bearer ${oc.env:JUDGE_HOST_CREDENTIAL}']"])
    assert config.trainer.experiment_name == "wk-4e1f"  # the run gets the real value
    save_run_record(str(tmp_path), config, ["npu-rl", "train"])
    record = recorded_config(config)
    assert record["trainer"]["experiment_name"] == MASK
    assert record["custom_reward_function"]["reward_kwargs"] == {"judge_auth": MASK, "judge": ["x", MASK]}
    for secret in secrets.values():
        for name in os.listdir(tmp_path):
            assert secret not in (tmp_path / name).read_text(), (name, secret)
        assert secret not in to_yaml(config)
