"""No secret is written down or printed: a run with secrets planted the ways a user hands them over (credentials in
URLs of tracker variables, a key given to Ray the verl way, an ``${oc.env:...}`` interpolation), its whole folder and
everything it printed grepped for them. The run itself still receives the real values."""

from __future__ import annotations

import json
import logging
import os

import pytest

from npu_rl.utils.redact import MASK, is_secret_name, redact_argv, redact_mapping, redact_text
from tests.trainer.conftest import base_overrides

URL_PASSWORD = "urlPw-7f3a"
URL_USER_TOKEN = "urlTok-91bc"
OVERRIDE_KEY = "overrideKey-55d1"
ENV_TOKEN = "envTok-c0de"
SECRETS = (URL_PASSWORD, URL_USER_TOKEN, OVERRIDE_KEY, ENV_TOKEN)


def _grep(folder: str) -> list[str]:
    found = []
    for root, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                data = f.read()
            found += [f"{os.path.join(root, name)}: {s}" for s in SECRETS if s.encode() in data]
    return found


def test_a_run_writes_and_prints_no_secret(tiny_model_dir, tmp_path, reward_file, capfd, monkeypatch):
    from npu_rl.trainer import main_ppo
    from npu_rl.trainer.interrupt import resume_command

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"https://bob:{URL_PASSWORD}@mlflow.example.com/api")
    monkeypatch.setenv("WANDB_BASE_URL", f"https://{URL_USER_TOKEN}@wandb.example.com")
    monkeypatch.setenv("NPU_RL_TEST_TOKEN", ENV_TOKEN)
    out_dir = str(tmp_path / "out")
    overrides = base_overrides(tiny_model_dir, out_dir, reward_file) + [
        "preset=grpo", "trainer.total_training_steps=1", "trainer.save_freq=1",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_API_KEY={OVERRIDE_KEY}",
        "+ray_kwargs.ray_init.runtime_env.env_vars.NPU_RL_TEST_TOKEN=${oc.env:NPU_RL_TEST_TOKEN}"]
    seen = {}
    original = main_ppo.run  # the trainer's run() as main_ppo calls it

    def spy(config, argv=None, checked=False):
        seen["env_vars"] = dict(config.ray_kwargs.ray_init.runtime_env["env_vars"])
        return original(config, argv, checked)

    monkeypatch.setattr(main_ppo, "run", spy)
    assert main_ppo.main(overrides, default_config="ppo_trainer") == 0
    # the run got the real values
    assert seen["env_vars"] == {"WANDB_API_KEY": OVERRIDE_KEY, "NPU_RL_TEST_TOKEN": ENV_TOKEN}
    printed = resume_command(["trainer.resume_mode=auto"])
    captured = capfd.readouterr()
    assert _grep(out_dir) == []
    for secret in SECRETS:
        assert secret not in captured.out + captured.err + printed, secret
    assert MASK in printed and "runtime_env.env_vars.WANDB_API_KEY" in printed
    (run_dir,) = [os.path.join(out_dir, "logs", d) for d in os.listdir(os.path.join(out_dir, "logs"))]
    with open(os.path.join(run_dir, "command.json")) as f:
        record = json.load(f)
    assert record["environment"]["MLFLOW_TRACKING_URI"] == f"https://{MASK}@mlflow.example.com/api"
    assert record["environment"]["NPU_RL_TEST_TOKEN"] == MASK
    assert f"+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_API_KEY={MASK}" in record["argv"]
    with open(os.path.join(run_dir, "config.yaml")) as f:
        written = f.read()
    assert f"WANDB_API_KEY: {MASK}" in written and f"NPU_RL_TEST_TOKEN: {MASK}" in written


def test_logs_are_masked(caplog):
    from npu_rl.utils.redact import RedactingFilter, install_log_redaction

    logger = logging.getLogger("npu_rl.test_redact")
    caplog.handler.addFilter(RedactingFilter())
    logger.warning("connecting to %s with WANDB_API_KEY=%s", "https://u:p@h", "k")
    assert caplog.records[-1].getMessage() == f"connecting to https://{MASK}@h with WANDB_API_KEY={MASK}"
    caplog.handler.filters.clear()
    install_log_redaction()  # every record, whatever handler (a library's own, added later) writes it
    logging.getLogger("some.library").warning("login with HF_TOKEN=%s", "hf_abc")
    assert caplog.records[-1].getMessage() == f"login with HF_TOKEN={MASK}"


@pytest.mark.parametrize("text, expected", [
    ("ray://admin:pw@head:10001", f"ray://{MASK}@head:10001"),
    ("+ray_kwargs.ray_init.runtime_env.env_vars.HF_TOKEN=hf_x", f"+ray_kwargs.ray_init.runtime_env.env_vars.HF_TOKEN={MASK}"),
    ('{"CLEARML_API_SECRET_KEY": "abc"}', f'{{"CLEARML_API_SECRET_KEY": "{MASK}"}}'),
    ("db_password: 'two words' then", f"db_password: '{MASK}' then"),
    ("data.prompt_key=prompt tokenizer_path=/m eos_token=<eos>", "data.prompt_key=prompt tokenizer_path=/m eos_token=<eos>"),
    ("http://host:8080/path", "http://host:8080/path"),
])
def test_redact_text(text, expected):
    assert redact_text(text) == expected


def test_redact_mapping_and_names():
    tree = {"ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": {"WANDB_API_KEY": "k", "PATH": "/bin"}}}},
            "trainer": {"experiment_name": "e", "urls": ["https://u:p@h"]}, "data": {"reward_fn_key": "data_source"}}
    out = redact_mapping(tree)
    assert out["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"] == {"WANDB_API_KEY": MASK, "PATH": "/bin"}
    assert out["trainer"] == {"experiment_name": "e", "urls": [f"https://{MASK}@h"]}
    assert out["data"] == tree["data"] and tree["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]["WANDB_API_KEY"] == "k"
    assert [is_secret_name(n) for n in ("HF_TOKEN", "x.WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "MY_PASSWORD_FILE",
                                        "prompt_key", "pad_token", "max_tokens")] == [True] * 4 + [False] * 3
    assert redact_argv(["a", "WANDB_API_KEY=z"]) == ["a", f"WANDB_API_KEY={MASK}"]

