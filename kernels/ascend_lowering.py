"""Lower every shipped Triton kernel through triton-ascend's own compiler front end, with the 910B tiles.

Run it with triton-ascend installed (it installs as ``triton``; in an environment of its own, since it replaces
OpenAI's triton), no NPU and no CANN needed::

    python -m npu_rl.kernels.ascend_lowering [--out DIR] [--arch Ascend910B3]

For each kernel and variant it calls ``triton.compile(ASTSource(kernel, signature, constants),
target=GPUTarget("npu", arch, 0))``. triton-ascend's stages for that target are ``ttir`` (Triton IR, Triton's own
front end), ``ttadapter`` (its ``triton-adapter-opt`` binary: Triton IR -> linalg/HIVM MLIR) and ``npubin``
(``bishengir-compile``, part of CANN: linalg -> an AI-core binary). The first two run here; ``npubin`` needs CANN
(it looks for ``ASCEND_HOME_PATH`` / ``bishengir-compile``), so this driver runs the first two stages itself
(``make_ttir`` and ``ttir_to_linalg`` of triton-ascend's backend, as ``triton.compile`` would) and stops there,
writing ``<kernel>.<variant>.ttir.mlir`` and ``.linalg.mlir`` into ``--out``. Exit status 1 if any variant fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from npu_rl.kernels.tiles import select_row_tiles, select_tiles

# Pointer element types of each kernel argument (the rest: i32 scalars; floats named below).
_BF16_PTRS = {"h_ptr", "w_ptr", "rh_ptr", "rw_ptr"}
_I64_PTRS = {"tgt_ptr"}
_FLOATS = {"inv_temp", "inv_t", "clip_low", "clip_high", "clip_c"}


def _signature(fn, constants: dict, from_logits: bool = False) -> dict[str, str]:
    sig = {}
    for name in fn.arg_names:
        if name in constants:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            if name in _I64_PTRS:
                sig[name] = "*i64"
            elif name in _BF16_PTRS and not (from_logits and name in ("h_ptr", "rh_ptr")):
                sig[name] = "*bf16"
            else:
                sig[name] = "*fp32"
        elif name in _FLOATS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def variants(arch: str):
    """(name, jit function, constants, from_logits) for every kernel and the variants the launchers use."""
    from npu_rl.kernels import policy_triton, triton_linear

    kind = f"npu:{arch}"
    fused, row = select_tiles(kind, 2), select_row_tiles(kind)
    out = []
    for from_logits, tile in ((False, fused), (True, row)):
        mode = "rows" if from_logits else "fused"
        for kl in (False, True):
            common = dict(KL=kl, TOKEN_TEMP=False, FROM_LOGITS=from_logits, BLOCK_N=tile.block_n,
                          BLOCK_V=tile.block_v, BLOCK_K=tile.block_k, EVEN_K=True, EVEN_RK=True, UPCAST=False,
                          PRECISION="ieee")  # what _compile_flags passes on NPU for bf16
            out.append((f"fwd_kernel.{mode}.kl{int(kl)}", triton_linear._fwd_kernel,
                        {**common, "NUM_STAT": triton_linear.NUM_STATS[kl]}, from_logits))
            out.append((f"bwd_kernel.{mode}.kl{int(kl)}", triton_linear._bwd_kernel,
                        {**common, "HAS_G0": True, "HAS_G1": kl, "GROUP_N": 8}, from_logits))
    for kl_kind in (0, 1):
        out.append((f"policy_fwd.kl{kl_kind}", policy_triton._fwd,
                    dict(KL_KIND=kl_kind, HAS_W=True, BLOCK=policy_triton.BLOCK), False))
        out.append((f"policy_bwd.kl{kl_kind}", policy_triton._bwd,
                    dict(KL_KIND=kl_kind, STRAIGHT_THROUGH=False, HAS_W=True, HAS_G_PG=True, HAS_G_KL=bool(kl_kind),
                         BLOCK=policy_triton.BLOCK), False))
    return out, {"fused": fused.__dict__, "rows": row.__dict__}


def lower(fn, constants: dict, arch: str, from_logits: bool) -> tuple[str, str]:
    """(Triton IR, linalg MLIR) of ``fn`` specialised on ``constants`` for ``GPUTarget("npu", arch, 0)``."""
    from triton.backends.ascend import compiler as ascend
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton._C.libtriton import ir

    target = GPUTarget("npu", arch, 0)
    backend = make_backend(target)
    src = ASTSource(fn, signature=_signature(fn, constants, from_logits), constants=constants)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    codegen = backend.get_codegen_implementation()
    module_map = backend.get_module_map() if hasattr(backend, "get_module_map") else {}
    try:
        module = src.make_ir(options, codegen, module_map, context)
    except TypeError:  # triton 3.2's make_ir takes no module map
        module = src.make_ir(options, codegen, context)
    metadata = {"hash": "ascend_lowering", "target": target, **options.__dict__}
    ttir = ascend.make_ttir(module, metadata, options)
    linalg = ascend.ttir_to_linalg(ttir, metadata, options, named_ops=True)
    return str(ttir), linalg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="ascend_lowering_out")
    parser.add_argument("--arch", default="Ascend910B3")
    args = parser.parse_args(argv)
    import triton

    os.makedirs(args.out, exist_ok=True)
    todo, tiles = variants(args.arch)
    report = {"triton": triton.__version__, "arch": args.arch, "tiles": tiles, "kernels": {}}
    failed = 0
    for name, fn, constants, from_logits in todo:
        try:
            ttir, linalg = lower(fn, constants, args.arch, from_logits)
        except Exception as exc:  # noqa: BLE001 - every failure is reported, with its stage
            failed += 1
            report["kernels"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
                                       "traceback": traceback.format_exc()[-3000:]}
            print(f"FAIL {name}: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
            continue
        for suffix, text in (("ttir.mlir", ttir), ("linalg.mlir", linalg)):
            with open(os.path.join(args.out, f"{name}.{suffix}"), "w", encoding="utf-8") as f:
                f.write(text)
        report["kernels"][name] = {"ok": True, "ttir_lines": ttir.count("\n"), "linalg_lines": linalg.count("\n")}
        print(f"ok   {name}: {ttir.count(chr(10))} lines of Triton IR -> {linalg.count(chr(10))} lines of linalg")
    with open(os.path.join(args.out, "report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
