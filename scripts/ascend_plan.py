"""What `scripts/setup.sh` installs on an Ascend node, from vLLM-Ascend's compatibility matrix and what the image has.

    python scripts/ascend_plan.py constraints   # pins for every stack package already installed (pip -c file)
    python scripts/ascend_plan.py missing       # requirements for the stack packages not installed (one a line)

The image's torch / torch_npu / vllm / vllm-ascend / triton-ascend are never replaced: each installed one is pinned
to its exact version in the constraints file. For missing ones the newest matrix row whose torch / torch_npu (and
vLLM-Ascend, when present) agree with what is installed names the versions. Reads only package metadata; imports
neither torch nor npu_rl (it runs before npu-rl is installed).
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
STACK = ("torch", "torch-npu", "vllm", "vllm-ascend", "triton-ascend", "numpy", "transformers")


def _matrix():
    path = os.path.join(_HERE, "..", "npu_rl", "device", "ascend_matrix.py")
    spec = importlib.util.spec_from_file_location("_npu_rl_ascend_matrix", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def installed() -> dict[str, str | None]:
    out = {}
    for name in STACK:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def constraints(versions: dict[str, str | None]) -> list[str]:
    return [f"{name}=={v}" for name, v in versions.items() if v is not None and name != "transformers"]


def choose_row(versions: dict[str, str | None], matrix):
    """The matrix row the installed stack belongs to: by vLLM-Ascend if installed, else the newest final release
    (a release candidate only when no final fits) whose torch and torch_npu releases match the installed ones; None
    when nothing matches."""
    if versions.get("vllm-ascend"):
        return matrix.release_for(versions["vllm-ascend"])
    fits = [row for row in matrix.MATRIX  # newest first
            if (not versions.get("torch") or matrix.same_release(versions["torch"], row.torch))
            and (not versions.get("torch-npu") or matrix.same_release(versions["torch-npu"], row.torch_npu))]
    finals = [row for row in fits if not matrix.parse(row.vllm_ascend).is_prerelease]
    return (finals or fits or [None])[0]


def missing(versions: dict[str, str | None], matrix) -> list[str]:
    """Requirements for stack packages that are not installed, from the matching matrix row."""
    row = choose_row(versions, matrix)
    if row is None:
        raise SystemExit(f"no vLLM-Ascend release in npu-rl's matrix fits torch {versions.get('torch')} / torch_npu "
                         f"{versions.get('torch-npu')}; install a matching pair (see docs/npu.md)")
    wanted = {"torch": row.torch, "torch-npu": row.torch_npu, "vllm": row.vllm[0], "vllm-ascend": row.vllm_ascend,
              "triton-ascend": row.triton_ascend}
    out = []
    for name, version in wanted.items():
        if versions.get(name) is None and version is not None:
            out.append(f"{name}=={matrix.parse(version)}")
    if versions.get("numpy") is None and matrix.needs_numpy_below_2(row.vllm_ascend):
        out.append("numpy<2")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("constraints", "missing"):
        print(__doc__, file=sys.stderr)
        return 2
    versions = installed()
    lines = constraints(versions) if argv[0] == "constraints" else missing(versions, _matrix())
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
