"""The light entry points import no heavy package and start fast: ``npu-rl --help`` and ``npu-rl train --help``
answer without torch, transformers, vLLM or Ray (the CLI's dispatch imports a command's module only when it runs)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "vllm", "ray", "triton", "torch_npu", "matplotlib", "pandas", "pyarrow")
PROBE = """
import json, sys
from npu_rl.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r})), file=sys.stderr)
"""


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"]])
def test_help_imports_nothing_heavy(argv):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", PROBE.format(heavy=set(HEAVY)), *argv], capture_output=True,
                         text=True, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout
    assert json.loads(out.stderr.strip().splitlines()[-1]) == []
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu_s < 2.0, f"npu-rl {' '.join(argv)} took {cpu_s:.2f} s of CPU to answer"
