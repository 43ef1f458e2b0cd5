"""Registers and spill stack of the beam-decode attention kernel, compiled for sm_90 with
Triton's bundled ptxas. Needs no GPU, so kernel changes can be checked for spills before a
device run.

    python scripts/probes/kernel_regs.py [--file flashrec/kernels/beam_attention.py]
        [--kv bf16 fp8e4nv] [--tiles 64x64x4 32x64x4 ...]   (BLOCK_M x BLOCK_N x num_warps)
        [--f16-dot]   (float16 products, as the engine launches it with FP8 KV)
        [--stages N]  (software pipeline stages, default 2)
        [--masked]    (decode-key blocks computed masked, ``live_only=False``; older
                       versions of the kernel have only that form)

Prints one line per (kv dtype, tile): ``REG:<registers per thread> STACK:<bytes>``; a STACK
above a few hundred bytes means the kernel spills to local memory in its inner loops. The
compile carries the alignment hints the JIT adds at the engine's launch (16-byte pointers,
strides that are multiples of 16); without them the loads do not vectorise and the FP8
launch shows a spill stack it does not have.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget

HEAD = {
    "G": 2,
    "HQ": 16,
    "D": 128,
    "DEPTH": 3,
    "PREC": "tf32",
    "I64_POOL": False,
    "I64_DEC": False,
    "F16_DOT": False,
    "LIVE_ONLY": True,
}  # OneRec-1.7B: 16 q / 8 kv heads


CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def cuobjdump_sm90(kernel, signature: dict, constexprs: dict, flag: str, **options) -> str:
    """Compile ``kernel`` for sm_90 with Triton's bundled ptxas (no GPU needed), with the
    alignment hints the JIT adds at the engine's launches (every pointer 16-byte aligned,
    every stride argument a multiple of 16), and return ``cuobjdump <flag>`` of the cubin."""
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(kernel.arg_names)
        if signature.get(name, "").startswith("*") or name.startswith(("s_", "stride"))
    }
    src = triton.compiler.ASTSource(
        fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs
    )
    cc = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cc.asm["cubin"])
        f.flush()
        out = subprocess.run([str(CUOBJDUMP), flag, f.name], capture_output=True, text=True)
    return out.stdout


def _load(path: str):
    spec = importlib.util.spec_from_file_location(f"_beam_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    k = mod._kernel()  # noqa: SLF001
    return k[0] if isinstance(k, tuple) else k


def usage(kernel, kv: str, block_m: int, block_n: int, warps: int, stages: int = 2) -> str:
    typed = {
        "q_ptr": "*bf16",
        "out_ptr": "*bf16",
        "part_o_ptr": "*fp32",
        "part_ml_ptr": "*fp32",
        "rows_ptr": "*i64",
        "scale": "fp32",
        **{n: f"*{kv}" for n in ("kp_ptr", "vp_ptr", "dk_ptr", "dv_ptr")},
    }
    const = {**HEAD, "BLOCK_M": block_m, "BLOCK_N": block_n}
    sig = {}
    for name in kernel.arg_names:
        if name in const:
            sig[name] = "constexpr"
        else:
            sig[name] = typed.get(name, "*i32" if name.endswith("_ptr") else "i32")
    # the JIT's specialisation at the engine's launch (see cuobjdump_sm90): without the
    # alignment hints loads do not vectorise and the counts would describe a kernel the
    # engine never runs
    out = cuobjdump_sm90(
        kernel,
        sig,
        # an older kernel file may lack a launch constant (LIVE_ONLY): only the ones it takes
        {k: v for k, v in const.items() if k in sig},
        "-res-usage",
        num_warps=warps,
        num_stages=stages,
    )
    line = next((x for x in out.splitlines() if "REG:" in x), "")
    return " ".join(w for w in line.split() if w.startswith(("REG:", "STACK:")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", default="flashrec/kernels/beam_attention.py")
    ap.add_argument("--kv", nargs="+", default=["bf16", "fp8e4nv"])
    ap.add_argument("--tiles", nargs="+", default=["64x64x4", "64x64x8", "32x64x4"])
    ap.add_argument(
        "--f16-dot", action="store_true", help="float16 products (the engine's FP8-KV launch)"
    )
    ap.add_argument("--stages", type=int, default=2, help="software pipeline stages")
    ap.add_argument(
        "--masked", action="store_true", help="decode-key blocks computed masked (live_only off)"
    )
    args = ap.parse_args()
    kernel = _load(args.file)
    HEAD["F16_DOT"] = args.f16_dot
    HEAD["LIVE_ONLY"] = not args.masked
    for kv in args.kv:
        for tile in args.tiles:
            bm, bn, w = (int(x) for x in tile.split("x"))
            print(
                f"{args.file} kv={kv} BLOCK_M={bm} BLOCK_N={bn} warps={w}: {usage(kernel, kv, bm, bn, w, args.stages)}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
