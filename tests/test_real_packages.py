"""Our use of torch_npu, vLLM-Ascend and triton-ascend, checked against the real wheels' sources.

Slow (downloads ~250 MB once): ``NPU_RL_SLOW=1 python -m pytest -q tests/test_real_packages.py``. The wheels are
fetched with ``pip download --no-deps --only-binary=:all:`` (never installed, never imported: their files are read
from the zip) into ``$NPU_RL_WHEEL_CACHE`` (default ``~/.cache/npu_rl/wheels``). What is checked is
``npu_rl/device/ascend_facts.py`` plus the per-release facts of ``npu_rl/device/ascend_matrix.py``.
"""

from __future__ import annotations

import ast
import glob
import os
import re
import subprocess
import sys
import zipfile

import pytest

from npu_rl.device import ascend_facts as facts
from npu_rl.device import ascend_matrix as matrix
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow

CACHE = os.environ.get("NPU_RL_WHEEL_CACHE", os.path.expanduser("~/.cache/npu_rl/wheels"))
X86 = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
ARM = ("manylinux_2_28_aarch64", "manylinux_2_24_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64")


def wheel(name: str, version: str, platforms=X86) -> zipfile.ZipFile:
    stem = name.replace("-", "_")
    pattern = os.path.join(CACHE, f"{stem}-{version}-*.whl")
    if not glob.glob(pattern):
        os.makedirs(CACHE, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.11",
               "-d", CACHE, f"{name}=={version}"]
        for platform in platforms:
            cmd += ["--platform", platform]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            pytest.fail(f"pip download {name}=={version} failed:\n{out.stderr[-2000:]}")
    return zipfile.ZipFile(sorted(glob.glob(pattern))[0])


def read(zf: zipfile.ZipFile, path: str) -> str:
    return zf.read(path).decode("utf-8")


def all_names(source: str) -> set[str]:
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("no __all__")


def find(tree: ast.AST, kind, name: str):
    for node in ast.walk(tree):
        if isinstance(node, kind) and node.name == name:
            return node
    raise AssertionError(f"{name} not found")


def plain_signature(fn: ast.FunctionDef) -> str:
    """'(a, b=1)' from a def, annotations and keyword-only markers dropped."""
    args = fn.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    parts = [a.arg if d is None else f"{a.arg}={ast.unparse(d)}" for a, d in zip(positional, defaults)]
    parts += [a.arg if d is None else f"{a.arg}={ast.unparse(d)}" for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    return "(" + ", ".join(parts) + ")"


# ------------------------------------------------------------------------------------------------ torch_npu
@pytest.fixture(scope="module", params=facts.WHEELS.torch_npu)
def torch_npu_wheel(request):
    return wheel("torch-npu", request.param)


def test_torch_npu_device_api_is_exported(torch_npu_wheel):
    exported = all_names(read(torch_npu_wheel, "torch_npu/npu/__init__.py"))
    assert set(facts.TORCH_NPU_DEVICE_API) <= exported, set(facts.TORCH_NPU_DEVICE_API) - exported


def test_torch_npu_fused_ops_accept_our_calls(torch_npu_wheel):
    docs = read(torch_npu_wheel, "torch_npu/_op_plugin_docs.py")
    for name, (num_positional, keywords) in facts.TORCH_NPU_OP_CALLS.items():
        line = re.search(rf"^torch_npu\.{name}\((Tensor .*?)\) ->", docs, re.M)
        assert line, f"{name}: no documented signature"
        params = [p.split(" ", 1)[1] for p in line.group(1).split(", ")]  # "Tensor self" -> "self"
        real = facts.signature_from("(" + ", ".join(params) + ")")
        real.bind(*range(num_positional), **dict.fromkeys(keywords, 0))  # our call binds
        ours = list(facts.signature(name).parameters.values())
        assert list(real.parameters.values())[:len(ours)] == ours, (name, real)


def test_torch_npu_config_is_set_only_and_compile_mode_signature(torch_npu_wheel):
    tree = ast.parse(read(torch_npu_wheel, facts.TORCH_NPU_CONFIG["file"]))
    cls = find(tree, ast.ClassDef, facts.TORCH_NPU_CONFIG["class"])
    methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert "__setattr__" in methods and "__getattr__" not in methods  # hasattr(config, key) is False
    assert facts.TORCH_NPU_CONFIG["key"] in ast.unparse(cls)
    assert plain_signature(find(tree, ast.FunctionDef, "set_compile_mode")) == \
        facts.TORCH_NPU_SIGNATURES["set_compile_mode"]
    init = read(torch_npu_wheel, "torch_npu/npu/__init__.py")
    assert re.search(r"^config = npu_config\._npuConfig\(\)|^config = _npuConfig\(\)", init, re.M) or \
        "_npuConfig" in init


def test_torch_npu_profiler_api(torch_npu_wheel):
    exported = all_names(read(torch_npu_wheel, "torch_npu/profiler/__init__.py"))
    assert set(facts.TORCH_NPU_PROFILER["exports"]) <= exported
    tree = ast.parse(read(torch_npu_wheel, "torch_npu/profiler/profiler.py"))
    init = next(n for n in find(tree, ast.ClassDef, "profile").body if getattr(n, "name", "") == "__init__")
    assert set(facts.TORCH_NPU_PROFILER["profile_kwargs"]) <= {a.arg for a in init.args.kwonlyargs}
    assert plain_signature(find(tree, ast.FunctionDef, "tensorboard_trace_handler")) == \
        facts.TORCH_NPU_SIGNATURES["profiler.tensorboard_trace_handler"]
    sched = ast.parse(read(torch_npu_wheel, "torch_npu/profiler/scheduler.py"))
    init = next(n for n in find(sched, ast.ClassDef, "Schedule").body if getattr(n, "name", "") == "__init__")
    assert plain_signature(init) == "(self, " + facts.TORCH_NPU_SIGNATURES["profiler.schedule"][1:]


def test_torch_npu_memory_history_api(torch_npu_wheel):
    tree = ast.parse(read(torch_npu_wheel, "torch_npu/npu/memory.py"))
    for name, keywords in facts.TORCH_NPU_MEMORY.items():
        fn = find(tree, ast.FunctionDef, name)
        accepted = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
        if fn.args.kwarg is None:  # **kwargs forwards to the implementation: check that one instead
            assert set(keywords) <= accepted, (name, accepted)
        else:
            impl = find(tree, ast.FunctionDef, f"{name}_impl")
            assert set(keywords) <= accepted | {a.arg for a in impl.args.args + impl.args.kwonlyargs}, name


# ------------------------------------------------------------------------------------------------ vLLM-Ascend
@pytest.fixture(scope="module", params=facts.WHEELS.vllm_ascend)
def vllm_ascend_wheel(request):
    return request.param, wheel("vllm-ascend", request.param, ARM)


def _worker_source(zf) -> str:
    for path in facts.VLLM_ASCEND_WORKER_FILES:
        if path in zf.namelist():
            return read(zf, path)
    raise AssertionError(f"none of {facts.VLLM_ASCEND_WORKER_FILES} in the wheel")


def test_vllm_ascend_env_nz_default_and_wake_up_refusal(vllm_ascend_wheel):
    _, zf = vllm_ascend_wheel
    envs = read(zf, "vllm_ascend/envs.py")
    for var, default in facts.VLLM_ASCEND_ENV.items():
        assert re.search(rf'os\.getenv\("{var}",\s*{default}\)', envs), var
    worker = ast.parse(_worker_source(zf))
    wake = find(find(worker, ast.ClassDef, "NPUWorker"), ast.FunctionDef, "wake_up")
    assert facts.VLLM_ASCEND_NZ_WAKE_UP_ERROR in ast.unparse(wake)


def test_vllm_ascend_worker_methods_and_reload_weights(vllm_ascend_wheel):
    version, zf = vllm_ascend_wheel
    cls = find(ast.parse(_worker_source(zf)), ast.ClassDef, "NPUWorker")
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert set(facts.VLLM_ASCEND_WORKER_METHODS) <= set(methods)
    for name, sig in facts.VLLM_ASCEND_WORKER_SIGNATURES.items():
        assert plain_signature(methods[name]) == sig, name
    assert ("reload_weights" in methods) == matrix.has_reload_weights(version)


def test_vllm_ascend_sampler_ignores_logprobs_mode(vllm_ascend_wheel):
    version, zf = vllm_ascend_wheel
    runner = ast.parse(read(zf, facts.VLLM_ASCEND_RUNNER_FILE))
    calls = [n for n in ast.walk(runner) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "AscendSampler"]
    assert calls and all(not c.args and not c.keywords for c in calls) == matrix.ignores_logprobs_mode(version)
    cls = find(runner, ast.ClassDef, "NPUModelRunner")
    assert set(facts.VLLM_ASCEND_RUNNER_ATTRS) <= {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}


def test_vllm_ascend_declared_requirements_agree_with_the_matrix(vllm_ascend_wheel):
    version, zf = vllm_ascend_wheel
    meta = read(zf, next(p for p in zf.namelist() if p.endswith(".dist-info/METADATA")))
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    names = {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in requires}
    assert "vllm" not in names  # the vLLM pin lives only in the matrix
    assert ("numpy<2.0.0" in requires) == matrix.needs_numpy_below_2(version)
    row = matrix.release_for(version)
    npu_pin = next(r for r in requires if r.startswith("torch-npu=="))
    assert matrix.same_release(npu_pin.split("==")[1], row.torch_npu)


# ------------------------------------------------------------------------------------------------ triton-ascend
@pytest.fixture(scope="module", params=facts.WHEELS.triton_ascend)
def triton_ascend_wheel(request):
    return wheel("triton-ascend", request.param)


def test_triton_ascend_front_end_files_and_api(triton_ascend_wheel):
    names = set(triton_ascend_wheel.namelist())
    assert set(facts.TRITON_ASCEND["files"]) <= names
    assert re.search(r"^from \.compiler import .*\bcompile\b", read(triton_ascend_wheel, "triton/__init__.py"), re.M)
    assert "ASTSource" in read(triton_ascend_wheel, "triton/compiler/__init__.py")
    assert "class GPUTarget" in read(triton_ascend_wheel, "triton/backends/compiler.py")
    assert "Ascend910B" in read(triton_ascend_wheel, "triton/backends/ascend/compiler.py") or \
        "910" in read(triton_ascend_wheel, "triton/backends/ascend/driver.py")


def test_every_triton_language_name_our_kernels_use_exists(triton_ascend_wheel):
    exported = all_names(read(triton_ascend_wheel, "triton/language/__init__.py"))
    used = set()
    for path in glob.glob(os.path.join(REPO_ROOT, "npu_rl", "kernels", "*.py")):
        used |= set(re.findall(r"\btl\.([a-z_][a-z0-9_]*)\b", open(path, encoding="utf-8").read()))
    assert used and used <= exported, used - exported
