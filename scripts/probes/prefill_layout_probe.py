"""Time the SDPA prefill of one prompt two ways, per backend: as the engine lays it out now
(q copied head-major, k/v repeated to the q heads, the output copied back to token rows: four
copies per layer) and straight from the QKV projection's rows (strided views, ``enable_gqa``,
the output read in place when SDPA returns it token-major).

    python scripts/probes/prefill_layout_probe.py [--lengths 1000 2465 5000]

Prints, per (backend, length, layout): ms per call (CUDA events, median of 50), the copy
kernels launched, whether the output is a view of SDPA's result, and max |diff| against the
engine's layout.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HKV, D = 16, 8, 128


def engine_layout(qkv: torch.Tensor, n: int) -> torch.Tensor:
    q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], dim=-1)
    qh = q.view(1, n, HQ, D).transpose(1, 2).contiguous()
    kh = k.view(1, n, HKV, D).transpose(1, 2).repeat_interleave(HQ // HKV, dim=1).contiguous()
    vh = v.view(1, n, HKV, D).transpose(1, 2).repeat_interleave(HQ // HKV, dim=1).contiguous()
    o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=D**-0.5)
    out = torch.empty(n, HQ * D, dtype=qkv.dtype, device=qkv.device)
    out.view(n, HQ, D).copy_(o[0].transpose(0, 1))
    return out


def row_layout(qkv: torch.Tensor, n: int) -> torch.Tensor:
    q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], dim=-1)
    qh = q.view(1, n, HQ, D).transpose(1, 2)
    kh = k.view(1, n, HKV, D).transpose(1, 2)
    vh = v.view(1, n, HKV, D).transpose(1, 2)
    o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=D**-0.5, enable_gqa=True)
    return o.transpose(1, 2).reshape(n, HQ * D)  # a view when SDPA wrote token-major


def copies(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    return sum(("elementwise" in x or "copy" in x.lower() or "Memcpy" in x) for x in names)


def time_ms(fn) -> float:
    ts = []
    for _ in range(60):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts[10:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="*", default=[1000, 2465, 5000])
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    backends = {
        "cudnn": [SDPBackend.CUDNN_ATTENTION],
        "flash": [SDPBackend.FLASH_ATTENTION],
        "flash+eff": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION],
    }
    for n in args.lengths:
        qkv = torch.randn(n, (HQ + 2 * HKV) * D, device="cuda", dtype=torch.bfloat16, generator=g)
        for name, bes in backends.items():
            ref = None
            for layout, fn in (("engine", engine_layout), ("rows", row_layout)):
                try:
                    with sdpa_kernel(bes):
                        out = fn(qkv, n)
                        ms = time_ms(lambda fn=fn, x=qkv, n=n: fn(x, n))
                        nc = copies(lambda fn=fn, x=qkv, n=n: fn(x, n))
                except RuntimeError as exc:
                    print(f"{name:9s} L={n:5d} {layout:6s}: unavailable ({str(exc)[:100]})")
                    continue
                ref = out if ref is None else ref
                diff = (out.float() - ref.float()).abs().max().item()
                print(
                    f"{name:9s} L={n:5d} {layout:6s}: {ms * 1000:8.1f} us  copy kernels {nc}  "
                    f"out contiguous {out.is_contiguous()}  maxdiff {diff:.2e}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
