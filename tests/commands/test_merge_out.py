"""``npu-rl merge --out DIR --force`` deletes only what a merge made: a folder holding model files alone. A home
folder, a run folder (the checkpoint being merged in it), the working directory, a mount point and a folder with
anyone's other files are refused, naming what would have been deleted, and left as they were."""

from __future__ import annotations

import os

import pytest

from npu_rl.commands.merge import main as merge
from npu_rl.utils.paths import replace_problems
from tests.trainer.test_checkpoints import _save_step

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _tree(folder) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes: what 'intact' means."""
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = f.read()
    return found


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("merge_out") / "run")
    _save_step(root, 1)
    _save_step(root, 2, seed=1)
    return root


def test_a_home_folder_and_the_run_folder_survive_force(run, tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    (home / "projects").mkdir(parents=True)
    (home / ".bashrc").write_text("export PATH=$HOME/bin:$PATH\n")
    (home / "projects" / "notes.txt").write_text("mine")
    monkeypatch.setenv("HOME", str(home))
    home_before, run_before = _tree(home), _tree(run)

    assert merge([os.path.join(run, "global_step_2"), "--out", str(home), "--force"]) == 2
    err = capsys.readouterr().err
    assert f"--out {home} will not be replaced" in err and f"the home folder {home}" in err
    assert ".bashrc" in err and "projects" in err

    assert merge([os.path.join(run, "global_step_2"), "--out", run, "--force"]) == 2
    err = capsys.readouterr().err
    assert f"the input {os.path.join(run, 'global_step_2')}" in err
    assert "a run's checkpoints (global_step_1, global_step_2, latest_checkpointed_iteration.txt)" in err
    assert _tree(home) == home_before and _tree(run) == run_before
    assert sorted(os.listdir(tmp_path)) == ["home"]  # no staging folder left beside


def test_the_working_directory_and_other_files_are_refused_a_previous_merge_is_replaced(run, tmp_path,
                                                                                         monkeypatch, capsys):
    step = os.path.join(run, "global_step_1")
    out = tmp_path / "merged"
    assert merge([step, "--out", str(out)]) == 0
    merged = _tree(out)
    assert "config.json" in merged and any(name.endswith(".safetensors") for name in merged)
    assert merge([step, "--out", str(out), "--force"]) == 0  # model files alone: a previous output, replaced
    assert _tree(out).keys() == merged.keys()

    (out / "notes.txt").write_text("mine")
    assert merge([step, "--out", str(out), "--force"]) == 2
    assert "files that are not a model's (notes.txt)" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "mine"

    (out / "notes.txt").unlink()
    monkeypatch.chdir(out)
    assert merge([step, "--out", ".", "--force"]) == 2
    assert f"the working directory {out}" in capsys.readouterr().err
    assert _tree(out) == merged


def test_a_mount_point_and_a_folder_inside_the_input_are_named(run):
    assert "/ is a mount point" in replace_problems("/")
    actor = os.path.join(run, "global_step_1", "actor")
    assert f"the input {actor}" in replace_problems(os.path.join(actor, "huggingface"), within=(actor,))
    assert replace_problems(os.path.join(run, "merged"), keep=(run,)) == []  # a folder of the run folder given: fine


def test_a_previous_merge_inside_the_run_folder_is_replaced(run, capsys):
    out = os.path.join(run, "merged")
    assert merge([run, "--out", out]) == 0
    assert merge([run, "--out", out, "--force"]) == 0
    assert merge([os.path.join(run, "global_step_2"), "--out", os.path.join(run, "global_step_2", "actor",
                                                                          "huggingface"), "--force"]) == 2
    assert "the input" in capsys.readouterr().err
