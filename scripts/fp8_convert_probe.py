"""fp32 -> float8_e4m3fn on the GPU against round-to-nearest-even: PyTorch's CPU conversion (the
reference), PyTorch's CUDA conversion, Triton's ``x.to(tl.float8e4nv)`` (the hardware
``cvt.rn.satfinite.e4m3x2.f32`` on sm_90) and the integer rounding of ``to_fp8(x, EMULATE=True)``
(flashrec/kernels/tl/common.py).

    python scripts/fp8_convert_probe.py [--n 20000000]

Inputs: random fp32 bit patterns with |x| in [2**-12, 480] (subnormal, normal and saturating
e4m3 ranges), every e4m3 midpoint (a tie) and the fp32 neighbours on both sides of each. Prints
one line per conversion: how many codes differ from the CPU's, and the first few that do.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from flashrec.kernels.tl.common import to_fp8


@triton.jit
def _convert(x_ptr, out_ptr, n, EMULATE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if EMULATE:
        y = to_fp8(x, True)
    else:
        y = x.to(tl.float8e4nv)
    tl.store(out_ptr + offs, y, mask=mask)


def inputs(n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(0x39800000, 0x43F00000, (n,), generator=g, dtype=torch.int64)
    x = bits.to(torch.int32).view(torch.float32)
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    codes = codes[torch.isfinite(codes)].unique()
    mid = (codes[1:] + codes[:-1]) / 2
    up = torch.nextafter(mid, torch.full_like(mid, 1e9))
    down = torch.nextafter(mid, torch.zeros_like(mid))
    x = torch.cat([x, mid, up, down])
    return torch.cat([x, -x]).clamp(-448.0, 448.0)  # the kernels clamp before converting


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000_000)
    args = ap.parse_args()
    x = inputs(args.n)
    ref = x.to(torch.float8_e4m3fn).view(torch.uint8)
    xd = x.cuda()
    outs = {"torch cuda": xd.to(torch.float8_e4m3fn)}
    for name, emulate in (("triton hardware", False), ("triton to_fp8 emulated", True)):
        out = torch.empty(x.numel(), dtype=torch.float8_e4m3fn, device="cuda")
        _convert[(triton.cdiv(x.numel(), 1024),)](xd, out, x.numel(), EMULATE=emulate, BLOCK=1024)
        outs[name] = out
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
