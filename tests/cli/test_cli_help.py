"""Every sub-command answers --help with exit status 0 (and trains, benchmarks or diagnoses nothing); doctor fails
when the chosen device cannot be used."""

from __future__ import annotations

import pytest

from npu_rl.cli import COMMANDS
from npu_rl.cli import main as cli


def _help_status(argv: list[str]) -> int:
    try:
        return cli(argv)
    except SystemExit as exc:  # argparse's --help exits
        return int(exc.code or 0)


@pytest.mark.parametrize("argv", [[c, "--help"] for c in COMMANDS] + [
    ["bench", "kernels", "--help"], ["bench", "rollout", "--help"], ["bench", "trainer", "--help"], ["--help"]])
def test_help_exits_zero(argv, capsys):
    assert _help_status(argv) == 0
    out = capsys.readouterr().out
    assert "usage:" in out
    assert "npu-rl doctor  (python" not in out  # doctor --help does not run the doctor


def test_doctor_fails_when_the_chosen_device_is_unusable(monkeypatch, capsys):
    from npu_rl.device import backend

    monkeypatch.setenv("DEVICE", "npu")
    monkeypatch.setattr(backend, "_npu_probe", lambda: (False, "torch_npu is not importable"))
    assert cli(["doctor"]) == 2
    err = capsys.readouterr().err
    assert "the chosen device cannot be used" in err and "set_env.sh" in err and "DEVICE=auto" in err
    monkeypatch.setenv("DEVICE", "cpu")
    assert cli(["doctor"]) in (0, 1)  # 1 only for known-bad package combinations on this machine


def test_version_and_parity_help(capsys):
    import npu_rl
    from npu_rl.cli import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"npu-rl {npu_rl.__version__}\n"
    assert main(["doctor", "--parity", "--help"]) == 0
    assert "usage: npu-rl doctor --parity" in capsys.readouterr().out
