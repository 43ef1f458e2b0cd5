"""GPU micro-benchmark of the fused kernels against their references (not a pytest module).

Run on the GPU machine from the repo root: ``python tests/kernels/bench_kernels.py``
(``--qk-sweep``: only qk_norm_rope_store's launch settings, checked bit for bit against the
default launch).
Prints time per call and effective bandwidth (bytes read + written / time) for Qwen3-1.7B
shapes (hidden 2048, intermediate 6144, 16 q / 8 kv heads of 128); warm-up excluded.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton.testing as tt

from flashrec.kernels import fp8, qk_rope_kv, rms_fp8, silu_fp8

DEV = "cuda"
BF16 = torch.bfloat16


def _bench(name: str, fn: Callable[[], object], nbytes: int) -> None:
    ms = tt.do_bench(fn, warmup=25, rep=100)
    print(f"{name:48s} {ms * 1e3:9.1f} us {nbytes / ms / 1e6:8.0f} GB/s", flush=True)


def _run(m: int) -> None:
    hidden, inter, hq, hkv, d = 2048, 6144, 16, 8, 128
    x = torch.randn(m, hidden, device=DEV, dtype=BF16)
    res = torch.randn_like(x)
    w = torch.rand(hidden, device=DEV, dtype=BF16) + 0.5
    nb = m * hidden * 7  # x, residual in; residual out (2 B each); codes out (1 B)
    for tag, f in (("triton", rms_fp8.rms_norm_quant_fp8_triton),
                   ("ref", rms_fp8.rms_norm_quant_fp8_ref)):  # fmt: skip
        _bench(f"rms_norm_quant_fp8 {tag} M={m}", lambda f=f: f(x, w, 1e-6, res), nb)
    gu = torch.randn(m, 2 * inter, device=DEV, dtype=BF16)
    for tag, f in (("triton", silu_fp8.silu_mul_quant_fp8_triton),
                   ("ref", silu_fp8.silu_mul_quant_fp8_ref)):  # fmt: skip
        _bench(f"silu_mul_quant_fp8 {tag} M={m}", lambda f=f: f(gu), m * inter * 5)
    _bench(f"per_token_quant_fp8 triton M={m}",
           lambda: fp8.per_token_quant_fp8_triton(x), m * hidden * 3)  # fmt: skip
    qkv = torch.randn(m, (hq + 2 * hkv) * d, device=DEV, dtype=BF16)
    pos = torch.randint(0, 4096, (m,), device=DEV)
    table = qk_rope_kv.build_cos_sin(8192, d, 1e6, DEV)
    nw = torch.rand(d, device=DEV, dtype=BF16) + 0.5
    kc = torch.zeros(m + 8, hkv, d, device=DEV, dtype=BF16)
    vc = torch.zeros_like(kc)
    loc = torch.randperm(m + 8, device=DEV)[:m]
    nb = m * d * ((hq + hkv) * 4 + hkv * 2 + 2 * hkv * 2)
    for tag, f in (("triton", qk_rope_kv.qk_norm_rope_store_triton),
                   ("ref", qk_rope_kv.qk_norm_rope_store_ref)):  # fmt: skip
        _bench(
            f"qk_norm_rope_store {tag} T={m}",
            lambda f=f: f(qkv, hq, hkv, d, pos, table, nw, nw, 1e-6, kc, vc, loc),
            nb,
        )
    wq, ws = fp8.quantize_weight_per_channel(torch.randn(4096, hidden, device=DEV) * 0.02)
    xq, xs = fp8.per_token_quant_fp8(x)
    ms = tt.do_bench(lambda: fp8.fp8_linear(xq, xs, wq, ws), warmup=25, rep=100)
    tflops = 2 * m * 4096 * hidden / ms / 1e9
    print(f"{'fp8_linear M=' + str(m) + ' N=4096 K=2048':48s} {ms * 1e3:9.1f} us "
          f"{tflops:8.0f} TFLOP/s")  # fmt: skip


def _qk_sweep(m: int) -> None:
    """qk_norm_rope_store's launch settings (heads per program x warps) at M tokens, with an
    FP8 KV cache written back into the row (the n=50 prefill's form): time, bandwidth, and
    whether every output equals the default launch's bit for bit. Session 8's H200 traces
    have this kernel at ~2 TB/s, half of what silu_mul and rms_norm reach."""
    hq, hkv, d = 16, 8, 128
    g = torch.Generator(device=DEV).manual_seed(1)
    qkv0 = torch.randn(m, (hq + 2 * hkv) * d, device=DEV, dtype=BF16, generator=g)
    pos = torch.randint(0, 4096, (m,), device=DEV, generator=g)
    table = qk_rope_kv.build_cos_sin(8192, d, 1e6, DEV)
    nw = torch.rand(d, device=DEV, dtype=BF16, generator=g) + 0.5
    loc = torch.randperm(m + 8, device=DEV, generator=g)[:m]

    def launch(qkv, kc, vc, **kw):
        return qk_rope_kv.qk_norm_rope_store_triton(
            qkv, hq, hkv, d, pos, table, nw, nw, 1e-6, kc, vc, loc, round_kv=True, **kw
        )

    def outputs(**kw):
        qkv = qkv0.clone()
        kc = torch.zeros(m + 8, hkv, d, device=DEV, dtype=torch.float8_e4m3fn)
        vc = torch.zeros_like(kc)
        launch(qkv, kc, vc, **kw)
        return qkv.view(torch.int16), kc.view(torch.uint8), vc.view(torch.uint8)

    ref = outputs()
    # bytes: the row in (q, k, v), q / k / v back into the row, k / v codes into the cache
    nb = m * d * ((hq + 2 * hkv) * 2 * 2 + 2 * hkv)
    for block_h in (4, 8, 16):
        for warps in (1, 2, 4, 8):
            same = all(
                torch.equal(a, b) for a, b in zip(outputs(block_h=block_h, num_warps=warps), ref)
            )
            qkv = qkv0.clone()
            kc = torch.zeros(m + 8, hkv, d, device=DEV, dtype=torch.float8_e4m3fn)
            vc = torch.zeros_like(kc)
            _bench(
                f"qk_norm_rope_store BLOCK_H={block_h} warps={warps} T={m} same={same}",
                lambda q=qkv, k=kc, v=vc, b=block_h, w=warps: launch(
                    q, k, v, block_h=b, num_warps=w
                ),
                nb,
            )


def main() -> None:
    import sys

    torch.manual_seed(0)
    if "--qk-sweep" in sys.argv:  # only the qk_norm_rope_store launch-settings sweep
        for m in (15000, 35000):
            _qk_sweep(m)
        return
    for m in (64, 1600, 16384):
        _run(m)


if __name__ == "__main__":
    main()
