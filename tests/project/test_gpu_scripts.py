"""scripts/gpu: the vLLM wheel is slimmed consistently (RECORD matches the files kept); the wheel lists pin one
version of each package."""

from __future__ import annotations

import importlib.util
import os
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _slim_module():
    spec = importlib.util.spec_from_file_location("slim_wheel", os.path.join(ROOT, "scripts", "gpu", "slim_wheel.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _slim(tmp_path, names: list[str], record_name: str) -> tuple[set[str], list[str]]:
    """Slim a wheel of ``names`` (and its RECORD): (the names kept, the files RECORD still lists)."""
    src, dst = tmp_path / "in.whl", tmp_path / "out.whl"
    with zipfile.ZipFile(src, "w") as z:
        for name in names:
            z.writestr(name, b"x" * 10)
        z.writestr(record_name, "\n".join(f"{n},sha256=a,10" for n in names) + "\n")
    _slim_module().slim(str(src), str(dst))
    with zipfile.ZipFile(dst) as z:
        return set(z.namelist()), [line.split(",")[0] for line in z.read(record_name).decode().splitlines()]


def test_slim_wheel_drops_the_unused_kernels_and_rewrites_record(tmp_path):
    names = ["vllm/_C.abi3.so", "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
             "vllm/_moe_C.abi3.so", "vllm/vllm-rs", "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so",
             "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so", "vllm/__init__.py"]
    kept, record = _slim(tmp_path, names, "vllm-0.22.0.dist-info/RECORD")
    expected = {"vllm/_C.abi3.so", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", "vllm/__init__.py",
                "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so"}
    assert kept == expected | {"vllm-0.22.0.dist-info/RECORD"} and set(record) == expected


def test_slim_wheel_drops_only_rays_java_workers(tmp_path):
    names = ["ray/jars/ray_dist.jar", "ray/_raylet.so", "ray/core/src/ray/raylet/raylet", "ray/__init__.py"]
    kept, record = _slim(tmp_path, names, "ray-2.60.0.dist-info/RECORD")
    assert kept == set(names[1:]) | {"ray-2.60.0.dist-info/RECORD"} and set(record) == set(names[1:])


def test_wheel_lists_pin_one_version_of_each_package():
    for name in ("vllm_wheels.txt", "bench_wheels.txt", "verl_wheels.txt"):
        with open(os.path.join(ROOT, "scripts", "gpu", name)) as fh:
            pins = [line.strip() for line in fh if line.strip() and not line.startswith("#")]
        assert all(p.count("==") == 1 for p in pins), name
        packages = [p.split("==")[0].lower().replace("_", "-") for p in pins]
        assert len(packages) == len(set(packages)), name
