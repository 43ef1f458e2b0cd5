"""SASS instruction counts of the fused q/k norm + RoPE + KV-write kernel, compiled for sm_90
with Triton's bundled ptxas: no GPU needed. Compares the bf16 / e4m3 rounding forms
(``--qk-rope-rounding``) as the engine launches the kernel at OneRec-1.7B's shapes (16 q / 8 kv
heads of 128, 8 heads per program, 2 warps, e4m3 cache written back into the row).

    python scripts/probes/kernel_sass.py [--cache fp8e4nv|bf16] [--no-round-back]

Prints one line per form: instructions per program (both branches: q heads and k heads) and
the most frequent opcodes. Counts are static (the code, not what a warp executes).
"""

from __future__ import annotations

import argparse
import collections

from kernel_regs import cuobjdump_sm90  # scripts/probes/ (this script's directory)

from flashrec.kernels.tl.qk_rope import qk_norm_rope_store_kernel as KERNEL


def sass_ops(emulate: bool, hw: bool, cache: str, round_back: bool) -> collections.Counter:
    types = {
        "qkv_ptr": "*bf16", "pos_ptr": "*i64", "cs_ptr": "*fp32", "qw_ptr": "*bf16",
        "kw_ptr": "*bf16", "kc_ptr": f"*{cache}", "vc_ptr": f"*{cache}", "loc_ptr": "*i64",
        "eps": "fp32", "k_inv_scale": "fp32", "v_inv_scale": "fp32", "k_scale": "fp32",
        "v_scale": "fp32",
    }  # fmt: skip
    const = {
        "HEAD_DIM": 128, "HALF": 64, "HALF_P2": 64, "BLOCK_H": 8, "HAS_Q_NORM": True,
        "HAS_K_NORM": True, "STORE": True, "ROUND_BACK": round_back, "EMULATE": emulate,
        "HW": hw,
    }  # fmt: skip
    sig = {n: "constexpr" if n in const else types.get(n, "i32") for n in KERNEL.arg_names}
    sass = cuobjdump_sm90(KERNEL, sig, const, "-sass", num_warps=2)
    ops: collections.Counter = collections.Counter()
    for line in sass.splitlines():
        line = line.strip()
        if not line.startswith("/*") or "*/" not in line:
            continue
        body = line.split("*/", 1)[1].strip()
        if not body or body.startswith("/*"):
            continue
        words = body.split()
        op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        ops[op.split(".")[0].rstrip(";")] += 1
    return ops


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default="fp8e4nv", choices=["fp8e4nv", "bf16"])
    ap.add_argument("--no-round-back", action="store_true")
    args = ap.parse_args()
    rb = args.cache == "fp8e4nv" and not args.no_round_back
    forms = (
        ("emulated (integer rounding)", True, False),
        ("hardware (inline-PTX bf16 conversions, the default)", True, True),
        ("compiler conversions (EMULATE off: folds round trips, not HF's rounding)", False, False),
    )
    for name, emulate, hw in forms:
        ops = sass_ops(emulate, hw, args.cache, rb)
        top = ", ".join(f"{k} {v}" for k, v in ops.most_common(8))
        print(f"{name}: {sum(ops.values())} instructions per program; {top}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
