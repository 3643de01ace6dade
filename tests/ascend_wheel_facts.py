"""Facts read from the real torch_npu / vLLM-Ascend / triton-ascend releases, recorded so that CI checks our use of
them without the network.

:func:`extract` reads one release (a wheel, or an sdist for the vLLM-Ascend releases PyPI has as source only: the
files are read from the archive, never installed or imported) into plain data; ``tests/data/ascend_wheels.json``
holds the result for every release in :data:`npu_rl.device.ascend_facts.WHEELS`. ``tests/device/test_real_packages.py``
checks our names, arguments, variables and config keys against that file (always), and, with ``NPU_RL_SLOW=1`` and
the network, re-extracts each release and compares it with the recording.

Record again after adding a release or a fact (the archives in one folder, e.g. from ``pip download --no-deps``):

    python -m tests.ascend_wheel_facts /path/to/archives
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
import tarfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "data", "ascend_wheels.json")


class Archive:
    """The text files of a wheel (zip) or an sdist (tar.gz, its top folder stripped), by package-relative path."""

    def __init__(self, path: str):
        self.path = path
        if path.endswith(".whl"):
            self._zip = zipfile.ZipFile(path)
            self.names = set(self._zip.namelist())
            self._tar = None
        else:
            self._tar = tarfile.open(path)
            self._members = {m.name.split("/", 1)[1]: m for m in self._tar.getmembers() if "/" in m.name}
            self.names = set(self._members)
            self._zip = None

    def read_bytes(self, name: str) -> bytes:
        if self._zip is not None:
            return self._zip.read(name)
        return self._tar.extractfile(self._members[name]).read()

    def read(self, name: str) -> str:
        return self.read_bytes(name).decode("utf-8", errors="replace")

    def metadata(self) -> str:
        name = next((n for n in self.names if n.endswith(".dist-info/METADATA")), None) or "PKG-INFO"
        return self.read(name)


def _all(source: str) -> list[str]:
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return sorted(ast.literal_eval(node.value))
    return []


def _find(tree: ast.AST, kind, name: str):
    return next((n for n in ast.walk(tree) if isinstance(n, kind) and n.name == name), None)


def plain_signature(fn: ast.FunctionDef) -> str:
    """'(a, b=1)' from a def, annotations and keyword-only markers dropped."""
    args = fn.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    parts = [a.arg if d is None else f"{a.arg}={ast.unparse(d)}" for a, d in zip(positional, defaults)]
    parts += [a.arg if d is None else f"{a.arg}={ast.unparse(d)}" for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    return "(" + ", ".join(parts) + ")"


def _requires(archive: Archive) -> list[str]:
    return sorted(line.split(":", 1)[1].strip() for line in archive.metadata().splitlines()
                  if line.startswith("Requires-Dist:"))


# ------------------------------------------------------------------------------------------------ torch_npu
OPS = ("npu_rms_norm", "npu_rotary_mul", "npu_swiglu", "npu_fusion_attention")
NATIVE_VARIABLES = ("CPU_AFFINITY_CONF", "HCCL_BUFFSIZE", "PYTORCH_NPU_ALLOC_CONF", "TASK_QUEUE_ENABLE")


def torch_npu_facts(a: Archive) -> dict:
    docs = a.read("torch_npu/_op_plugin_docs.py")
    ops = {}
    for name in OPS:
        line = re.search(rf"^torch_npu\.{name}\((Tensor .*?)\) ->", docs, re.M)
        ops[name] = line.group(1) if line else None
    profiler = ast.parse(a.read("torch_npu/profiler/profiler.py"))
    profile_init = next(n for n in _find(profiler, ast.ClassDef, "profile").body if getattr(n, "name", "") == "__init__")
    sched = ast.parse(a.read("torch_npu/profiler/scheduler.py"))
    sched_init = next(n for n in _find(sched, ast.ClassDef, "Schedule").body if getattr(n, "name", "") == "__init__")
    experimental = ast.parse(a.read("torch_npu/profiler/experimental_config.py"))
    exp_init = next(n for n in _find(experimental, ast.ClassDef, "_ExperimentalConfig").body
                    if getattr(n, "name", "") == "__init__")
    level_cls = _find(experimental, ast.ClassDef, "ProfilerLevel")
    levels = sorted(t.id for n in level_cls.body if isinstance(n, ast.Assign) for t in n.targets)
    path_creator = a.read("torch_npu/profiler/_profiler_path_creator.py")
    trace_folder = re.search(r'"(\{\}_\{\}_ascend_pt)"', path_creator)
    mstx = ast.parse(a.read("torch_npu/npu/mstx.py"))
    mstx_cls = _find(mstx, ast.ClassDef, "mstx")
    memory = ast.parse(a.read("torch_npu/npu/memory.py"))
    memory_fns = {}
    for name in ("_record_memory_history", "_dump_snapshot", "_set_allocator_settings"):
        fn = _find(memory, ast.FunctionDef, name)
        impl = _find(memory, ast.FunctionDef, f"{name}_impl")
        memory_fns[name] = sorted({x.arg for f in (fn, impl) if f is not None
                                   for x in f.args.args + f.args.kwonlyargs}) if fn is not None else None
    config = ast.parse(a.read("torch_npu/npu/npu_config.py"))
    config_cls = _find(config, ast.ClassDef, "_npuConfig")
    entry_points = next((a.read(n) for n in a.names if n.endswith(".dist-info/entry_points.txt")), "")
    native = next((n for n in a.names if n.endswith("lib/libtorch_npu.so")), None)
    blob = a.read_bytes(native) if native else b""
    return {
        "npu_all": _all(a.read("torch_npu/npu/__init__.py")),
        "ops": ops,
        "set_compile_mode": plain_signature(_find(config, ast.FunctionDef, "set_compile_mode")),
        "config_methods": sorted(n.name for n in config_cls.body if isinstance(n, ast.FunctionDef)),
        "config_mentions_allow_internal_format": "allow_internal_format" in ast.unparse(config_cls),
        "profiler_all": _all(a.read("torch_npu/profiler/__init__.py")),
        "profile_kwargs": sorted(x.arg for x in profile_init.args.kwonlyargs),
        "tensorboard_trace_handler": plain_signature(_find(profiler, ast.FunctionDef, "tensorboard_trace_handler")),
        "schedule": plain_signature(sched_init),
        "experimental_config": plain_signature(exp_init),
        "profiler_levels": levels,
        "trace_folder": trace_folder.group(1) if trace_folder else None,
        "mstx": {n.name: plain_signature(n) for n in mstx_cls.body if isinstance(n, ast.FunctionDef)},
        "memory": memory_fns,
        "backend_entry_point": "[torch.backends]" in entry_points and "torch_npu = torch_npu:_autoload" in entry_points,
        "native_variables": sorted(v for v in NATIVE_VARIABLES if v.encode() in blob),
    }


# ------------------------------------------------------------------------------------------------ vLLM-Ascend
def vllm_ascend_facts(a: Archive) -> dict:
    envs = a.read("vllm_ascend/envs.py")
    nz = re.search(r'"VLLM_ASCEND_ENABLE_NZ":\s*lambda:\s*int\(os\.getenv\("VLLM_ASCEND_ENABLE_NZ",\s*(\d)\)\)', envs)
    worker_file = next(p for p in ("vllm_ascend/worker/worker_v1.py", "vllm_ascend/worker/worker.py") if p in a.names)
    worker = ast.parse(a.read(worker_file))
    npu_worker = _find(worker, ast.ClassDef, "NPUWorker")
    methods = {n.name: n for n in npu_worker.body if isinstance(n, ast.FunctionDef)}
    wake = ast.unparse(methods["wake_up"])
    runner = ast.parse(a.read("vllm_ascend/worker/model_runner_v1.py"))
    samplers = [n for n in ast.walk(runner) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "AscendSampler"]
    runner_cls = _find(runner, ast.ClassDef, "NPUModelRunner")
    config_src = a.read("vllm_ascend/ascend_config.py")
    keys = {}
    for key in ("weight_nz_mode", "enable_cpu_binding"):
        get = re.search(rf'additional_config\.get\("{key}",\s*([^)]+)\)', config_src)
        field = re.search(rf"^\s+{key}: \w+ = (\S+)$", config_src, re.M)
        via_env = re.search(rf'"{key}",\s*"(VLLM_ASCEND_\w+)",', config_src)
        keys[key] = {"read": bool(get or field or via_env),
                     "default": (get.group(1) if get else field.group(1) if field else
                                 "env:" + via_env.group(1) if via_env else None)}
    return {
        "nz_variable_default": nz.group(1) if nz else None,
        "wake_up_checks": sorted(w for w in ("VLLM_ASCEND_ENABLE_NZ", "weight_nz_mode") if w in wake),
        "wake_up_raises_on_nz": "FRACTAL_NZ" in wake and "raise ValueError" in wake,
        "worker_methods": sorted(methods),
        "worker_signatures": {n: plain_signature(methods[n]) for n in ("sleep", "wake_up") if n in methods},
        "runner_methods": sorted(n.name for n in runner_cls.body if isinstance(n, ast.FunctionDef)),
        "sampler_calls_without_arguments": bool(samplers) and all(not c.args and not c.keywords for c in samplers),
        "additional_config": keys,
        "forbids_unknown_keys": 'extra="forbid"' in config_src or "Unknown keys are\n    forbidden" in config_src,
        "get_ascend_config": bool(re.search(r"^def get_ascend_config\(", config_src, re.M)),
        "requires": _requires(a),
    }


# ------------------------------------------------------------------------------------------------ triton-ascend
TRITON_FILES = ("triton/backends/ascend/triton-adapter-opt", "triton/backends/ascend/compiler.py",
                "triton/backends/compiler.py", "triton/compiler/__init__.py")


def triton_ascend_facts(a: Archive) -> dict:
    return {
        "files": sorted(f for f in TRITON_FILES if f in a.names),
        "exports_compile": bool(re.search(r"^from \.compiler import .*\bcompile\b", a.read("triton/__init__.py"),
                                          re.M)),
        "ast_source": "ASTSource" in a.read("triton/compiler/__init__.py"),
        "gpu_target": "class GPUTarget" in a.read("triton/backends/compiler.py"),
        "language_all": _all(a.read("triton/language/__init__.py")),
    }


# ------------------------------------------------------------------------------------------------ msprobe
def msprobe_facts(a: Archive) -> dict:
    def methods(path: str, cls: str) -> dict:
        node = _find(ast.parse(a.read(path)), ast.ClassDef, cls)
        return {n.name: plain_signature(n) for n in node.body if isinstance(n, ast.FunctionDef)}

    init = a.read("msprobe/pytorch/__init__.py")
    return {
        "pytorch_exports_precision_debugger": bool(re.search(r"^from .* import .*\bPrecisionDebugger\b", init, re.M)),
        "precision_debugger": methods("msprobe/pytorch/dump/debugger/precision_debugger.py", "PrecisionDebugger"),
        "base_precision_debugger": methods("msprobe/core/dump/debugger/precision_debugger.py",
                                           "BasePrecisionDebugger"),
    }


EXTRACTORS = {"torch-npu": torch_npu_facts, "vllm-ascend": vllm_ascend_facts, "triton-ascend": triton_ascend_facts,
              "mindstudio-probe": msprobe_facts}


def archive_name(path: str) -> tuple[str, str] | None:
    """('vllm-ascend', '0.23.0.post1') from an archive's file name."""
    match = re.match(r"^(torch_npu|vllm_ascend|triton_ascend|mindstudio_probe)-([^-]+?)(?:-cp|\.tar\.gz$)",
                     os.path.basename(path))
    return (match.group(1).replace("_", "-"), match.group(2)) if match else None


def extract(path: str) -> dict:
    name, _ = archive_name(path)
    return EXTRACTORS[name](Archive(path))


def load() -> dict:
    with open(RECORD, encoding="utf-8") as f:
        return json.load(f)


def main(folders: list[str]) -> int:
    from npu_rl.device.ascend_facts import WHEELS

    wanted = {"torch-npu": WHEELS.torch_npu, "vllm-ascend": WHEELS.vllm_ascend, "triton-ascend": WHEELS.triton_ascend,
              "mindstudio-probe": WHEELS.mindstudio_probe}
    found = {}
    for folder in folders:
        for entry in sorted(os.listdir(folder)):
            parsed = archive_name(entry)
            if parsed and parsed[1] in wanted.get(parsed[0], ()):
                found[parsed] = os.path.join(folder, entry)
    missing = [f"{n}=={v}" for n, vs in wanted.items() for v in vs if (n, v) not in found]
    if missing:
        print(f"missing archives: {', '.join(missing)}", file=sys.stderr)
        return 1
    record = {"note": "extracted by tests/ascend_wheel_facts.py from the PyPI archives (wheels; sdists where PyPI "
                      "has only the source)", "releases": {}}
    for (name, version), path in sorted(found.items()):
        record["releases"].setdefault(name, {})[version] = {"archive": os.path.basename(path), **extract(path)}
    with open(RECORD, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {RECORD}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
