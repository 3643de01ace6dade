"""Rewrite vllm's wheel without the files an in-process engine on a Hopper GPU never loads (and ray's without its Java
workers); RECORD matches the rest.

    python scripts/gpu/slim_wheel.py IN.whl OUT.whl [--keep-moe]

Dropped (see carry_vllm.sh): FlashAttention-2 (``_vllm_fa2_C``: vllm.vllm_flash_attn imports it in a try and Hopper
runs FA3), the MoE and FlashMLA extensions (imported in a try / only for MoE and MLA models), deep_gemm builds for
other Pythons than 3.12, the ``vllm-rs`` frontend binary (only with VLLM_RUST_FRONTEND_PATH), the API server's static
files. ``--keep-moe`` keeps the MoE extension (``_moe_C``: vLLM's fused-MoE routing and alignment kernels), for
MoE models (``KEEP_MOE=1 scripts/gpu/carry_vllm.sh ...``).
"""

from __future__ import annotations

import re
import sys
import zipfile

DROP = [
    r"^vllm/vllm_flash_attn/_vllm_fa2_C\.abi3\.so$",
    r"^vllm/_moe_C\.abi3\.so$",
    r"^vllm/_flashmla(_extension)?_C\.abi3\.so$",
    r"^vllm/third_party/deep_gemm/_C\.cpython-3(10|11|13|14)-x86_64-linux-gnu\.so$",
    r"^vllm/vllm-rs$",
    r"^vllm/entrypoints/serve/instrumentator/static/",
    r"^ray/jars/",  # Ray's Java workers (32 MB of ray's 79): verl and npu-rl start Python workers only
]


MOE = r"^vllm/_moe_C\.abi3\.so$"


def dropped(name: str, keep_moe: bool = False) -> bool:
    return any(re.search(pattern, name) for pattern in DROP if not (keep_moe and pattern == MOE))


def slim(src: str, dst: str, keep_moe: bool = False) -> tuple[int, int]:
    kept = gone = 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            if dropped(info.filename, keep_moe):
                gone += info.compress_size
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                data = ("\n".join(line for line in lines if not dropped(line.split(",")[0], keep_moe)) + "\n").encode()
            zout.writestr(info, data)
            kept += info.compress_size
    return kept, gone


if __name__ == "__main__":
    kept, gone = slim(sys.argv[1], sys.argv[2], keep_moe="--keep-moe" in sys.argv[3:])
    print(f"slim_wheel: kept {kept / 1e6:.1f} MB, dropped {gone / 1e6:.1f} MB")
