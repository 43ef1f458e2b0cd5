"""fp32 -> float8_e4m3fn on the GPU against round-to-nearest-even: PyTorch's CPU conversion (the
reference), PyTorch's CUDA conversion, Triton's plain ``x.to(tl.float8e4nv)`` (the hardware
``cvt.rn.satfinite.e4m3x2.f32`` on sm_90) and the integer rounding of the kernels' shared
``to_fp8(x, EMULATE=True)`` (flashrec/kernels/tl/common.py).

    python scripts/probes/fp8_convert_probe.py [--n 20000000]

Inputs: ``flashrec.kernels.fp8.e4m3_probe_values`` (random bit patterns over the subnormal,
normal and saturating ranges, every tie and its neighbours, both signs). Prints one line per
conversion: how many codes differ from the CPU's, and the first few that do (a sign error
shows up here: +0 for negative values that round to zero).
"""

from __future__ import annotations

import argparse

import torch

from flashrec.kernels.fp8 import e4m3_probe_values, to_fp8_triton


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000_000)
    args = ap.parse_args()
    x = e4m3_probe_values(args.n)
    ref = x.to(torch.float8_e4m3fn).view(torch.uint8)
    xd = x.cuda()
    outs = {
        "torch cuda": xd.to(torch.float8_e4m3fn),
        "triton hardware": to_fp8_triton(xd, emulate=False),
        "triton to_fp8 emulated": to_fp8_triton(xd, emulate=True),
    }
    for name, out in outs.items():
        got = out.view(torch.uint8).cpu()
        bad = (got != ref).nonzero().flatten()
        first = [
            f"{x[i].item()!r}: cpu {ref[i].item():#04x} got {got[i].item():#04x}" for i in bad[:4]
        ]
        print(f"{name:24s} {len(bad):>9d} of {x.numel()} differ from the CPU  {'; '.join(first)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
