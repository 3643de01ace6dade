"""Our use of torch_npu, vLLM-Ascend and triton-ascend, checked against what the real releases contain.

Every name, argument, environment variable and config key npu-rl uses (``npu_rl/device/ascend_facts.py``, plus the
per-release facts of ``npu_rl/device/ascend_matrix.py``) is checked against ``tests/data/ascend_wheels.json``: the
facts ``tests/ascend_wheel_facts.py`` read from each release's archive (never installed, never imported). That part
runs offline, in the default test command.

The recording itself is checked by the slow part (``NPU_RL_SLOW=1``; downloads ~400 MB once): each archive is fetched
again (``pip download --no-deps --only-binary=:all:``; the PyPI sdist for releases that have no wheel) into
``$NPU_RL_WHEEL_CACHE`` (default ``~/.cache/npu_rl/wheels``), re-read, and compared with the recording. Without the
network it skips, naming the archive it could not fetch.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import urllib.request

import pytest
from packaging.version import Version

from npu_rl.device import ascend_facts as facts
from npu_rl.device import ascend_matrix as matrix
from tests import ascend_wheel_facts as wheel_facts
from tests.conftest import REPO_ROOT

RECORD = wheel_facts.load()["releases"]
ARM = ("manylinux_2_34_aarch64", "manylinux_2_28_aarch64", "manylinux_2_24_aarch64", "manylinux_2_17_aarch64",
       "manylinux2014_aarch64")


def releases(name: str) -> list[str]:
    return list(getattr(facts.WHEELS, name.replace("-", "_")))


def test_every_release_we_check_is_recorded():
    for name in ("torch-npu", "vllm-ascend", "triton-ascend", "mindstudio-probe"):
        assert sorted(RECORD[name]) == sorted(releases(name)), name


# ------------------------------------------------------------------------------------------------ torch_npu
@pytest.fixture(params=releases("torch-npu"))
def torch_npu(request):
    return request.param, RECORD["torch-npu"][request.param]


def test_torch_npu_device_api_is_exported(torch_npu):
    _, rec = torch_npu
    assert set(facts.TORCH_NPU_DEVICE_API) <= set(rec["npu_all"]), set(facts.TORCH_NPU_DEVICE_API) - set(rec["npu_all"])


def test_torch_npu_fused_ops_accept_our_calls(torch_npu):
    _, rec = torch_npu
    for name, (num_positional, keywords) in facts.TORCH_NPU_OP_CALLS.items():
        documented = rec["ops"][name]
        assert documented, f"{name}: no documented signature"
        params = [re.sub(r"=.*", "", p.split(" ", 1)[1]) for p in documented.split(", ") if p.strip() != "*"]
        bound = params[:num_positional]
        assert len(bound) == num_positional and set(keywords) <= set(params), (name, params)
        if name in facts.TORCH_NPU_SIGNATURES:  # the stand-in's signature is the real one's beginning
            real = facts.signature_from("(" + ", ".join(p.split(" ", 1)[1].replace('"', "'")
                                                        for p in documented.split(", ")) + ")")
            ours = list(facts.signature(name).parameters.values())
            assert list(real.parameters.values())[:len(ours)] == ours, (name, documented)


def test_torch_npu_config_is_set_only_and_compile_mode_signature(torch_npu):
    _, rec = torch_npu
    assert "__setattr__" in rec["config_methods"] and "__getattr__" not in rec["config_methods"]
    assert rec["config_mentions_allow_internal_format"]
    assert rec["set_compile_mode"] == facts.TORCH_NPU_SIGNATURES["set_compile_mode"]


def test_torch_npu_profiler_api(torch_npu):
    _, rec = torch_npu
    prof = facts.TORCH_NPU_PROFILER
    assert set(prof["exports"]) <= set(rec["profiler_all"])
    assert set(prof["profile_kwargs"]) <= set(rec["profile_kwargs"])
    assert rec["tensorboard_trace_handler"] == facts.TORCH_NPU_SIGNATURES["profiler.tensorboard_trace_handler"]
    # later releases append optional arguments (2.10: skip_first_wait=0): ours must be the beginning
    assert rec["schedule"].startswith("(self, " + facts.TORCH_NPU_SIGNATURES["profiler.schedule"][1:-1])
    experimental = {p.split("=")[0].strip() for p in rec["experimental_config"].strip("()").split(",")}
    assert set(prof["experimental_kwargs"]) <= experimental, experimental
    assert set(prof["levels"]) <= set(rec["profiler_levels"])
    assert rec["trace_folder"] == prof["trace_folder"]
    assert set(prof["mstx"]) <= set(rec["mstx"])
    assert rec["mstx"]["range_start"].startswith("(message") and rec["mstx"]["range_end"].startswith("(range_id")


def test_torch_npu_memory_api_and_native_variables(torch_npu):
    version, rec = torch_npu
    for name, keywords in facts.TORCH_NPU_MEMORY.items():
        assert rec["memory"][name] is not None and set(keywords) <= set(rec["memory"][name]), name
    name, since = facts.TORCH_NPU_ALLOCATOR_SETTINGS
    assert (rec["memory"][name] is not None) == (Version(version) >= Version(since)), version  # else: logged, kept
    assert set(facts.TORCH_NPU_NATIVE_VARIABLES) <= set(rec["native_variables"])
    assert rec["backend_entry_point"]  # `import torch` loads torch_npu (and raises RuntimeError when it cannot)


# ------------------------------------------------------------------------------------------------ vLLM-Ascend
@pytest.fixture(params=releases("vllm-ascend"))
def vllm_ascend(request):
    return request.param, RECORD["vllm-ascend"][request.param]


def test_vllm_ascend_nz_variable_key_and_wake_up_refusal(vllm_ascend):
    """What npu-rl sets turns NZ off in every release: the variable where it is read, the key where it is read."""
    version, rec = vllm_ascend
    assert rec["wake_up_raises_on_nz"] and facts.VLLM_ASCEND_NZ_WAKE_UP_ERROR
    reads_variable = rec["nz_variable_default"] is not None
    assert reads_variable == matrix.reads_nz_variable(version)
    if reads_variable:
        assert rec["nz_variable_default"] == facts.VLLM_ASCEND_ENV["VLLM_ASCEND_ENABLE_NZ"]
    key = rec["additional_config"]["weight_nz_mode"]
    assert key["read"] == matrix.reads_nz_key(version)
    assert reads_variable or key["read"], version  # one of the two always decides
    from npu_rl.device.npu_env import effective_weight_nz_mode, worker_process_env

    ours = {"weight_nz_mode": 0, "enable_cpu_binding": False}
    env = worker_process_env("npu", sleep_mode=True)
    assert effective_weight_nz_mode(ours, env, version) == 0
    assert effective_weight_nz_mode(None, {}, version) == 1  # the release's own default


def test_vllm_ascend_additional_config_keys_we_set_exist(vllm_ascend):
    version, rec = vllm_ascend
    for key, since in facts.VLLM_ASCEND_ADDITIONAL_CONFIG.items():
        assert rec["additional_config"][key]["read"] == (Version(version) >= Version(since)), (version, key)
    if rec["forbids_unknown_keys"]:  # every key we pass must then be a field
        assert all(rec["additional_config"][key]["read"] for key in facts.VLLM_ASCEND_ADDITIONAL_CONFIG)
    if Version(version) >= Version(matrix.CPU_BINDING_DEFAULT_ON_SINCE):
        assert rec["additional_config"]["enable_cpu_binding"]["default"] == "True"
    assert rec["get_ascend_config"] and facts.VLLM_ASCEND_GET_CONFIG.endswith("get_ascend_config")


def test_vllm_ascend_worker_methods_and_reload_weights(vllm_ascend):
    version, rec = vllm_ascend
    assert set(facts.VLLM_ASCEND_WORKER_METHODS) <= set(rec["worker_methods"])
    for name, sig in facts.VLLM_ASCEND_WORKER_SIGNATURES.items():
        assert rec["worker_signatures"][name] == sig, name
    assert ("reload_weights" in rec["worker_methods"]) == matrix.has_reload_weights(version)
    assert set(facts.VLLM_ASCEND_RUNNER_ATTRS) <= set(rec["runner_methods"])


def test_vllm_ascend_sampler_ignores_logprobs_mode(vllm_ascend):
    version, rec = vllm_ascend
    assert rec["sampler_calls_without_arguments"] == matrix.ignores_logprobs_mode(version)


def test_vllm_ascend_declared_requirements_agree_with_the_matrix(vllm_ascend):
    version, rec = vllm_ascend
    requires = rec["requires"]
    names = {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in requires}
    assert "vllm" not in names  # the vLLM pin lives only in the matrix
    assert ("numpy<2.0.0" in requires) == matrix.needs_numpy_below_2(version)
    assert ("arctic-inference==0.1.1" in requires) == (Version(version) >= Version(matrix.ARCTIC_INFERENCE_SINCE))
    row = matrix.match_release(version).row
    npu_pin = next(r for r in requires if r.startswith("torch-npu=="))
    assert matrix.same_release(npu_pin.split("==")[1], row.torch_npu)


# ------------------------------------------------------------------------------------------------ triton-ascend
@pytest.fixture(params=releases("triton-ascend"))
def triton_ascend(request):
    return RECORD["triton-ascend"][request.param]


def test_triton_ascend_front_end_files_and_api(triton_ascend):
    assert set(facts.TRITON_ASCEND["files"]) <= set(triton_ascend["files"])
    assert triton_ascend["exports_compile"] and triton_ascend["ast_source"] and triton_ascend["gpu_target"]


def test_every_triton_language_name_our_kernels_use_exists(triton_ascend):
    used = set()
    for path in glob.glob(os.path.join(REPO_ROOT, "kernels", "*.py")):
        used |= set(re.findall(r"\btl\.([a-z_][a-z0-9_]*)\b", open(path, encoding="utf-8").read()))
    assert used and used <= set(triton_ascend["language_all"]), used - set(triton_ascend["language_all"])


# ------------------------------------------------------------------------------------------------ msprobe
@pytest.mark.parametrize("version", releases("mindstudio-probe"))
def test_msprobe_precision_debugger_api(version):
    rec = RECORD["mindstudio-probe"][version]
    assert rec["pytorch_exports_precision_debugger"]
    init = rec["precision_debugger"]["__init__"]
    assert all(f"{kw}=" in init for kw in facts.MSPROBE["init_kwargs"]), init
    assert set(facts.MSPROBE["methods"]) <= set(rec["precision_debugger"])
    assert set(facts.MSPROBE["base_methods"]) <= set(rec["base_precision_debugger"])


# ------------------------------------------------------------------------------------------------ the recording
CACHE = os.environ.get("NPU_RL_WHEEL_CACHE", os.path.expanduser("~/.cache/npu_rl/wheels"))


def _fetch(name: str, version: str) -> str:
    """The archive the recording was read from, downloaded once into CACHE (skips without the network)."""
    archive = RECORD[name][version]["archive"]
    path = os.path.join(CACHE, archive)
    if os.path.exists(path):
        return path
    os.makedirs(CACHE, exist_ok=True)
    if archive.endswith(".whl"):
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.11", "-d", CACHE, f"{name}=={version}"]
        for platform in ARM:
            cmd += ["--platform", platform]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0 or not os.path.exists(path):
            pytest.skip(f"could not download {archive} (offline?): {out.stderr[-500:]}")
        return path
    try:  # an sdist: pip download would try to build it; take the file PyPI lists
        request = urllib.request.Request(f"https://pypi.org/simple/{name}/",
                                         headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            url = next(f["url"] for f in json.load(response)["files"] if f["filename"] == archive)
        urllib.request.urlretrieve(url, path)
    except (OSError, StopIteration) as exc:
        pytest.skip(f"could not download {archive} (offline?): {exc}")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("name, version", [(n, v) for n in ("torch-npu", "vllm-ascend", "triton-ascend",
                                                            "mindstudio-probe") for v in releases(n)])
def test_the_recording_is_what_the_release_contains(name, version):
    fresh = wheel_facts.extract(_fetch(name, version))
    recorded = {k: v for k, v in RECORD[name][version].items() if k != "archive"}
    assert fresh == recorded
