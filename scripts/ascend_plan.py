"""What `scripts/setup.sh` installs on an Ascend node, from vLLM-Ascend's compatibility matrix and what the image has.

    python scripts/ascend_plan.py constraints   # pins for every stack package already installed (pip -c file)
    python scripts/ascend_plan.py missing       # requirements for the stack packages not installed (one a line)
    python scripts/ascend_plan.py check         # exit 0: the stack is there, keep it; 3: what to fetch, from where

The image's torch / torch_npu / vllm / vllm-ascend / triton-ascend are never replaced: each installed one is pinned
to its exact version in the constraints file. For missing ones the matrix row of the installed vLLM-Ascend (nearest
row for a post / rc / dev release; the newest row, flagged "not checked", for a release newer than the matrix), else
the newest row whose torch / torch_npu agree with what is installed, names the versions.

``check`` decides before anything is installed. A node whose torch_npu or vLLM-Ascend / vLLM is missing cannot be
completed from PyPI alone (recorded in ``npu_rl/device/ascend_pypi_index.json``): triton-ascend 3.2.1 / 3.2.2 / dev
builds are only on the vendor's index, vLLM-Ascend from 0.13.0 requires arctic-inference==0.1.1 (an sdist only:
built from source with cmake and ninja), newer vLLM-Ascend releases are sdists (built against CANN), PyPI's
vLLM-Ascend wheels are A2 builds (``NPUWorker`` asserts the SoC on A3), and vLLM itself is built with
``VLLM_TARGET_DEVICE=empty``. So ``check`` prints the exact commands, each naming where its package comes from,
and setup.sh stops there, leaving nothing half-installed. Reads only package metadata; imports neither torch nor
npu_rl (it runs before npu-rl is installed).
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os
import platform
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
STACK = ("torch", "torch-npu", "vllm", "vllm-ascend", "triton-ascend", "numpy", "transformers")
REQUIRED = ("torch", "torch-npu", "vllm", "vllm-ascend")  # without these there is no Ascend rollout stack
INDEX_FILE = os.path.join(_HERE, "..", "npu_rl", "device", "ascend_pypi_index.json")
VENDOR_INDEX = "https://mirrors.huaweicloud.com/ascend/repos/pypi"  # vllm-ascend's install guide and Dockerfile
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
IMAGES = "quay.io/ascend/vllm-ascend:v{release} (A2) or :v{release}-a3 (A3)"
EXIT_STOP = 3


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
    """The matrix row the installed stack belongs to: by vLLM-Ascend if installed (nearest row; a release newer than
    the matrix takes its newest row, with a warning on stderr), else the newest final release (a release candidate
    only when no final fits) whose torch and torch_npu releases match the installed ones; None when nothing
    matches."""
    if versions.get("vllm-ascend"):
        found = matrix.match_release(versions["vllm-ascend"])
        if found is None:
            raise SystemExit(f"vllm-ascend {versions['vllm-ascend']} is older than every release in npu-rl's matrix "
                             f"({matrix.MATRIX[-1].vllm_ascend} .. {matrix.MATRIX[0].vllm_ascend}); use a newer "
                             "vllm-ascend image (docs/npu.md)")
        if found.note:
            print(f"note: {found.note}", file=sys.stderr)
        return found.row
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


# ------------------------------------------------------------------------------------------------ bare nodes
def load_index(path: str = INDEX_FILE) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)["packages"]


def pypi_source(index: dict, name: str, version: str, machine: str, python: str) -> str:
    """Where ``name==version`` comes from for this machine (``aarch64`` / ``x86_64``) and Python (``3.11``) by
    the recorded PyPI files: ``wheel`` (a wheel for it), ``sdist`` (source only: built here), ``vendor`` (not on
    PyPI)."""
    files = index.get(name, {}).get("files", {}).get(version, [])
    tag = "cp" + python.replace(".", "")
    wheels = [f for f in files if f.endswith(".whl") and machine in f and (f"-{tag}-" in f or "-py3-none" in f
                                                                        or "-abi3-" in f)]
    if wheels:
        return "wheel"
    if any(f.endswith((".tar.gz", ".zip")) for f in files):
        return "sdist"
    return "vendor"


def bare_node_plan(versions: dict[str, str | None], matrix, index: dict, machine: str, python: str,
                   torch_npu_loads: bool) -> list[str]:
    """What is missing for an Ascend rollout stack, as the exact commands that install it and where each package
    comes from; empty when the required packages are there (and torch_npu loads)."""
    absent = [name for name in REQUIRED if versions.get(name) is None]
    if not absent and torch_npu_loads:
        return []
    row, clash = choose_row(versions, matrix), []
    if row is None:  # e.g. a CPU torch of another release: the set goes into a fresh environment
        row = next(r for r in matrix.MATRIX if not matrix.parse(r.vllm_ascend).is_prerelease)
        clash = [f"torch {versions.get('torch')} is installed here and fits no vLLM-Ascend release: use a fresh "
                 "environment (python -m venv) for the set below."]
        versions = {**versions, "torch": None}
    lines = [f"The Ascend rollout stack is incomplete on this node (missing: {', '.join(absent) or 'none'}"
             + ("" if torch_npu_loads else "; torch_npu does not load: if it is installed, source CANN's "
                                             "set_env.sh (source scripts/atlas/env.sh) and run setup.sh again") + ").",
             f"Easiest: run npu-rl inside the official image {IMAGES.format(release=row.vllm_ascend)}, which has "
             "all of it; setup.sh then keeps it.",
             f"Otherwise install vLLM-Ascend {row.vllm_ascend}'s set (npu-rl's matrix: vLLM {row.vllm[0]}, CANN "
             f"{row.cann}, torch {row.torch}, torch_npu {row.torch_npu}, triton-ascend {row.triton_ascend or '-'}, "
             f"Python {row.python}) by hand, after sourcing CANN {row.cann}'s set_env.sh:", *clash]
    pins = (["numpy<2"] if matrix.needs_numpy_below_2(row.vllm_ascend) else [])
    constraint = (" -c <(printf '%s\\n' " + " ".join(f"'{p}'" for p in pins) + ")") if pins else ""
    if versions.get("torch") is None:
        where = "PyPI" if machine == "aarch64" else f"the CPU build from {TORCH_CPU_INDEX}"
        extra = "" if machine == "aarch64" else f" --index-url {TORCH_CPU_INDEX}"
        lines.append(f"  pip install{extra} torch=={row.torch}{constraint}    # {where}")
    for name, version in (("torch-npu", row.torch_npu), ("triton-ascend", row.triton_ascend)):
        if version is None or versions.get(name) is not None:
            continue
        pv = str(matrix.parse(version))
        source = pypi_source(index, name, pv, machine, python)
        extra = "" if source == "wheel" else f" --extra-index-url {VENDOR_INDEX}"
        lines.append(f"  pip install{extra} {name}=={pv}{constraint}    # "
                     + ("PyPI wheel" if source == "wheel" else "not on PyPI as a wheel: the vendor's index"))
    if versions.get("vllm") is None:
        lines.append(f"  VLLM_TARGET_DEVICE=empty pip install --no-binary vllm vllm=={row.vllm[0]}{constraint}    "
                     "# PyPI source, built without device code")
    if versions.get("vllm-ascend") is None:
        pv = str(matrix.parse(row.vllm_ascend))
        if matrix.parse(pv) >= matrix.parse(matrix.ARCTIC_INFERENCE_SINCE):
            lines.append("  pip install cmake ninja && pip install --no-binary arctic-inference arctic-inference==0.1.1"
                         "    # required by vllm-ascend >= 0.13.0; PyPI has only its source")
        source = pypi_source(index, "vllm-ascend", pv, machine, python)
        note = {"wheel": "PyPI wheel: an A2 build; on A3 build it from source (SOC_VERSION) or use the -a3 image",
                "sdist": "PyPI has only its source: built here against CANN (set SOC_VERSION when no NPU is "
                         "visible)",
                "vendor": "not on PyPI: the vendor's index"}[source]
        extra = f" --extra-index-url {VENDOR_INDEX}" + ("" if machine == "aarch64" else
                                                         f" --extra-index-url {TORCH_CPU_INDEX}")
        lines.append(f"  pip install{extra} vllm-ascend=={pv}{constraint}    # {note}")
    lines.append("then run scripts/setup.sh again: it keeps what is installed and adds npu-rl. Nothing was installed.")
    return lines


def torch_npu_loads() -> bool:
    """Whether ``import torch_npu`` works in this Python (a separate interpreter: a failure must not stop us)."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", "import torch_npu"], capture_output=True, text=True)
    return out.returncode == 0


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("constraints", "missing", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    versions = installed()
    if argv[0] == "check":
        python = f"{sys.version_info[0]}.{sys.version_info[1]}"
        lines = bare_node_plan(versions, _matrix(), load_index(), platform.machine(), python,
                               torch_npu_loads() if versions.get("torch-npu") else False)
        if lines:
            print("\n".join(lines), file=sys.stderr)
            return EXIT_STOP
        return 0
    lines = constraints(versions) if argv[0] == "constraints" else missing(versions, _matrix())
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
