"""The step line: on stdout, the algorithm's own losses shown by default, its keys set by trainer.console_keys."""

from __future__ import annotations

from npu_rl.tracking import ConsoleBackend

METRICS = {"critic/score/mean": 0.5, "actor/pg_loss": 0.25, "actor/kl_loss": 0.125, "critic/vf_loss": 2.0,
           "actor/lr": 1e-6, "timing_s/gen": 1.0}


def test_the_losses_are_shown_by_default_and_the_keys_can_be_set():
    lines = []
    ConsoleBackend(lines.append).log(METRICS, 3)
    assert lines == ["step 3: actor/kl_loss=0.125  actor/pg_loss=0.25  critic/score/mean=0.5  critic/vf_loss=2"]
    ConsoleBackend(lines.append, keys=("actor/lr", "timing_s/")).log(METRICS, 4)
    assert lines[-1] == "step 4: actor/lr=1.000e-06  timing_s/gen=1"


def test_step_lines_go_to_stdout(capsys):
    ConsoleBackend().log({"critic/score/mean": 1.0}, 1)
    out = capsys.readouterr()
    assert out.out == "step 1: critic/score/mean=1\n" and out.err == ""


def test_console_keys_is_a_trainer_key():
    from npu_rl.config.loader import load_config

    config = load_config(["trainer.console_keys=[critic/vf_loss,actor/kl_loss]"], "quickstart")
    assert config.trainer.console_keys == ["critic/vf_loss", "actor/kl_loss"]
